"""Each molecule scenario, end to end: create, prepare, converge, idempotence, verify (testinfra), destroy.

Most of a scenario's time is spent waiting (containers booting, models loading, services restarting, play
round trips), so the scenarios run in lanes side by side: the scenarios of one lane run in order, the lanes
at the same time. The suite is CPU-bound, its three llama.cpp compilations the heaviest steps: they take both cores
each and run one after another (AFTER), on containers of a higher CPU weight, while the other lanes take what they
leave; a scenario that reuses another's build waits for it, so each tree is still compiled once per suite. The
steps run one by one so that their times are measured: the summary at the end prints each scenario's steps,
its slowest tests, its CPU time, the machine's load, its converge and no-op re-run (idempotence) times and
their ratio, and what failed.
"""

import os
import re
import signal
import subprocess
import threading
import time

import pytest
from cgroup_cpu import containers_cpu

# The lanes. The suite's length is its chain of compilations: `cluster` compiles 0c1e570 (CPU), then `upgrade` the
# git-sourced f29f967, then `mixed` 0c1e570 for Debian 13 (AFTER; its Debian 12 build is cluster's), each on a
# container of a higher CPU weight (molecule.yml: cpu_shares); mixed's verify compiles 2cabdd3, the same sources from
# git, for both releases, nearly all from the compiler cache; `prefill` (with TLS) reuses cluster's build. Each
# scenario of the chain
# has a lane of its own, so that its containers are up and its converge starts as soon as the compilation before it
# ends; the light scenarios take the cores that the chain leaves.
LANES = [
    ["cluster"],
    ["upgrade"],
    ["firewall", "chrony"],
    ["mixed"],
    ["prefill"],
]
# Run only when named in LLAMA_OPTIONAL_SCENARIOS (their make target sets it): not part of `make test`.
# `vulkan` compiles a tree of its own (the Vulkan backend, its shaders) and runs it on Mesa's lavapipe: about 16 CPU
# minutes, which the 2-core suite cannot spend within its hour.
OPTIONAL = {"cuda": "make test-cuda builds the CUDA backend (about 25 minutes on 2 cores; needs nvcc)",
            "vulkan": "make test-vulkan builds the Vulkan backend and runs it on Mesa's lavapipe (about 25 minutes "
                      "on 2 cores)"}
LANES += [[name] for name in OPTIONAL]
SCENARIOS = [name for lane in LANES for name in lane]
# No `syntax` step: ansible-lint (make test runs it first) checks every playbook's syntax, the molecule ones included,
# and the converge would fail on a syntax error anyway.
STEPS = ["destroy", "create", "prepare", "converge", "idempotence", "verify"]
# Steps a scenario's own tests make, on the same state: the suite does not pay for them twice.
COVERED = {
    ("cluster", "idempotence"): "test_collection.py runs the installed collection's site playbook on the converged "
                                "cluster and asserts changed=0 on every host",
    ("upgrade", "idempotence"): "test_a_rollback_on_purpose_returns_to_the_replaced_build runs site.yml on the "
                                "converged build again and asserts changed=0 on every host",
}
# (scenario, step) starts once each (scenario, step) listed has ended: it reuses the build those compile (0c1e570
# on CPU, by cluster), which is then in the suite's artifact cache, or it compiles and should not share the
# cores with another compilation. The other scenarios' containers boot after cluster's, the first of the chain.
AFTER = {
    ("upgrade", "create"): [("cluster", "create")],
    ("vulkan", "create"): [("cluster", "create")],
    ("mixed", "create"): [("cluster", "create")],
    ("prefill", "create"): [("cluster", "create")],
    ("prefill", "converge"): [("cluster", "converge")],
    ("upgrade", "converge"): [("cluster", "converge")],
    ("vulkan", "converge"): [("cluster", "converge"), ("upgrade", "converge")],
    ("mixed", "converge"): [("cluster", "converge"), ("upgrade", "converge"), ("vulkan", "converge")],
}
# The chain of compilations and the scenario that ends it: its steps run at this machine's normal priority, every
# other step's processes on this machine (molecule, ansible-playbook, docker) at BACKGROUND_NICE, so that they
# take the cores the chain leaves. (Containers' processes are weighted by their cgroups: molecule.yml cpu_shares.)
CHAIN = {("cluster", "create"), ("cluster", "converge"), ("upgrade", "converge"), ("vulkan", "converge"),
         ("mixed", "converge")}
BACKGROUND_NICE = 10
# A step that runs this long has hung: CI's whole run has 90 minutes. (An hour killed the cluster's verify of 58
# minutes on a loaded CI host, a run that would have ended in time.)
STEP_TIMEOUT = 4800


def lower_priority(pid):
    """Lower the priority of the session `pid` leads: its autogroup's nice where the kernel groups each session's
    processes (sched_autogroup), on top of the processes' own nice value."""
    try:
        with open(f"/proc/{pid}/autogroup", "w", encoding="ascii") as autogroup:
            autogroup.write(f"{BACKGROUND_NICE}\n")
    except OSError:
        pass


def plain_lines(output):
    """A molecule step's output as lines, molecule's frame ("│ ") and colours removed."""
    return [re.sub(r"^\s*│ ?", "", re.sub(r"\x1b\[[0-9;]*m", "", raw)) for raw in output.splitlines()]


def measured(output):
    """The figures a verify step's tests recorded (suite_report.figures), without their prefix."""
    return [line[len("figure: "):] for line in plain_lines(output) if line.startswith("figure: ")]


def slowest(output):
    """The `--durations` lines of a verify step's pytest run and its heaviest tests by CPU (suite_report.py), whole:
    the steps run without molecule's framed output (NO_COLOR, Lanes.molecule), which wraps long lines."""
    return [" ".join(line.split()) for line in plain_lines(output)
            if re.match(r"^\d+\.\d+s (call|setup|teardown)\b|^\d+\.\d+ cpu-s ", line)]


class Lanes:
    """Runs the selected scenarios in their lanes, each in a thread; `result(name)` waits for one."""

    def __init__(self, project, selected, step_times, slowest_tests, timeline, cpu, figures):
        self.project, self.step_times, self.slowest_tests, self.timeline = project, step_times, slowest_tests, timeline
        self.figures = figures
        self.cpu = cpu
        self.selected = selected
        self.ended = {(name, step): threading.Event() for name in SCENARIOS for step in STEPS}
        self.results = {name: None for name in selected}
        self.done = {name: threading.Event() for name in selected}
        self.stopping = threading.Event()
        self.processes = set()
        self.lock = threading.Lock()
        self.epoch = time.monotonic()
        self.threads = [threading.Thread(target=self.run_lane, args=([n for n in lane if n in selected],), daemon=True)
                        for lane in LANES]
        self.sampler = threading.Thread(target=self.sample_load, daemon=True)

    def sample_load(self):
        """This machine's busy CPU time every 10 s, for the summary's load table."""
        while not all(event.is_set() for event in self.done.values()):
            self.cpu["load"].append((time.monotonic() - self.epoch, *machine_cpu()))
            time.sleep(10)

    def start(self):
        for thread in self.threads + [self.sampler]:
            thread.start()

    def molecule(self, step, name, timeout):
        # A session of its own: an interrupt ends molecule and the ansible-playbook it runs, together. The shell's
        # `times` prints the CPU time of everything molecule ran on this machine (ansible-playbook, docker).
        background = (name, step) not in CHAIN
        command = ["bash", "-c", 'molecule "$@"; code=$?; times; exit $code', "molecule", step, "-s", name]
        if background:
            command = ["nice", "-n", str(BACKGROUND_NICE), *command]
        # NO_COLOR: molecule prints a step's output plainly, not in its frame, which wraps lines at the terminal's
        # width (80 columns without one) and drops the space it breaks at: the summary reads whole lines.
        process = subprocess.Popen(command, cwd=self.project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True, env=dict(os.environ, NO_COLOR="1"))
        if background:
            lower_priority(process.pid)
        with self.lock:
            self.processes.add(process)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            output += f"\n(killed after {timeout} s)"
        with self.lock:
            self.processes.discard(process)
        times = re.findall(r"^(\d+)m([\d.]+)s (\d+)m([\d.]+)s$", output, re.M)
        if times:
            self.cpu["host"][name] += sum(int(m) * 60 + float(s) for m, s in zip(times[-1][::2], times[-1][1::2]))
        return process.returncode, output

    def run_lane(self, lane):
        for name in lane:
            self.results[name] = self.run_scenario(name)
            self.done[name].set()

    def run_scenario(self, name):
        outputs, failure = [], None
        self.timeline[name] = [time.monotonic() - self.epoch, None]
        try:
            for step in STEPS:
                for after in AFTER.get((name, step), []):
                    if after[0] in self.selected:
                        self.ended[after].wait()
                if self.stopping.is_set():
                    failure = "the suite was interrupted"
                    break
                if (name, step) in COVERED:
                    self.ended[(name, step)].set()
                    continue
                started = time.monotonic()
                code, output = self.molecule(step, name, timeout=STEP_TIMEOUT)
                self.step_times[name][step] = time.monotonic() - started
                outputs.append(output)
                if step == "verify":
                    self.slowest_tests[name] = slowest(output)
                    self.figures[name] = measured(output)
                if code != 0:
                    failure = f"molecule {step} -s {name} failed (output above)"
                    break
                self.ended[(name, step)].set()
        finally:
            for step in STEPS:  # whoever waits on this scenario goes on (and compiles for itself if it failed)
                self.ended[(name, step)].set()
            self.cpu["containers"][name] = containers_cpu(name)
            code, output = self.molecule("destroy", name, timeout=600)
            outputs.append(output)
            if code != 0 and failure is None:
                failure = f"molecule destroy -s {name} failed (output above)"
            self.timeline[name][1] = time.monotonic() - self.epoch
        return "\n".join(outputs), failure

    def result(self, name):
        self.done[name].wait()
        return self.results[name]

    def stop(self):
        """On an interrupted run: end what runs now; each lane then destroys its scenario's containers."""
        self.stopping.set()
        with self.lock:
            running = list(self.processes)
        for process in running:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for thread in self.threads:
            thread.join(timeout=900)


def failed_lines(output, limit=60):
    """What a failed step's output says went wrong, for the summary at the end of the log: its failed tests and
    their assertion lines (pytest), or its failed tasks (ansible-playbook)."""
    lines = [line.rstrip() for line in plain_lines(output)]
    wanted = [line for line in lines if re.match(r"^(FAILED |ERROR |E  |fatal: |failed: |\S+\.py:\d+: )", line)]
    return wanted[-limit:] or lines[-limit:]


def machine_cpu():
    """(busy, total) CPU seconds of this machine since boot, all cores (/proc/stat)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - fields[3] - fields[4]) / hz, sum(fields) / hz


@pytest.fixture(scope="session")
def lanes(request, suite_caches, project, step_times, slowest_tests, timeline, cpu, figures):
    if not os.environ.get("LLAMA_TEST_IMAGE"):
        pytest.fail("LLAMA_TEST_IMAGE is not set: run through `make test` (it builds the image and fixtures)")
    selected = {item.callspec.params["scenario"] for item in request.session.items
                if item.originalname == "test_scenario" and hasattr(item, "callspec")} - set(skipped_optional())
    runner = Lanes(project, selected, step_times, slowest_tests, timeline, cpu, figures)
    runner.start()
    yield runner
    if not all(event.is_set() for event in runner.done.values()):
        runner.stop()


def skipped_optional():
    wanted = os.environ.get("LLAMA_OPTIONAL_SCENARIOS", "").split(",")
    return [name for name in OPTIONAL if name not in wanted]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, request, failures):
    if scenario in skipped_optional():
        pytest.skip(OPTIONAL[scenario])
    lanes = request.getfixturevalue("lanes")
    try:
        output, failure = lanes.result(scenario)
    except KeyboardInterrupt:
        lanes.stop()
        raise
    print(output)  # shown by pytest when the scenario fails
    if failure is not None:
        failures[scenario] = failed_lines(output)
    assert failure is None, failure
