"""Suite-wide settings: the project root, a fresh controller artifact cache per run of the scenarios, step timings.

The cache is shared by every scenario of one run (llama.cpp is compiled once per suite and reused) and
emptied when the next run's scenarios start (fresh_caches(), from tests/test_molecule.py), so the cluster scenario's
compile count is measured from zero. The tests without containers (make checks) run beside the scenarios and
leave it alone.
"""

import collections
import os
import shutil
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
# What failed in the scenarios, written at the end of their run (pytest_terminal_summary).
SUMMARY = PROJECT / ".cache" / "scenarios-failed.txt"
# The molecule scenarios' shared helpers (cgroup_cpu: the containers' CPU time, read by the suite's summary too).
sys.path.insert(0, str(PROJECT / "molecule" / "shared"))
STEP_TIMES = collections.defaultdict(dict)
SLOWEST_TESTS = {}
TIMELINE = {}
CPU = {"host": collections.defaultdict(float), "containers": {}, "load": []}
FAILURES = {}
FIGURES = {}


def fresh_caches():
    """The suite's artifact and compiler caches, emptied: every tree the scenarios need is compiled once per run. An
    environment variable that names another cache (a developer's warm one) is left as it is."""
    caches = {"LLAMA_ARTIFACT_CACHE": PROJECT / ".cache" / "suite-artifacts",
              "LLAMA_CCACHE": PROJECT / ".cache" / "suite-ccache"}
    for variable, cache in caches.items():
        if variable not in os.environ:
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir(parents=True)
            os.environ[variable] = str(cache)


@pytest.fixture(scope="session")
def suite_caches():
    """The caches the scenarios share (fresh_caches()), set up once before they start."""
    fresh_caches()


@pytest.fixture(scope="session")
def project():
    return PROJECT


@pytest.fixture(scope="session")
def step_times():
    """{scenario: {molecule step: seconds}}, printed at the end of the run."""
    return STEP_TIMES


@pytest.fixture(scope="session")
def slowest_tests():
    """{scenario: the slowest tests of its verify step (pytest --durations lines) and its heaviest by CPU}, printed
    at the end."""
    return SLOWEST_TESTS


@pytest.fixture(scope="session")
def timeline():
    """{scenario: [start, end]}, minutes since the lanes started, printed at the end."""
    return TIMELINE


@pytest.fixture(scope="session")
def cpu():
    """CPU seconds per scenario on this machine's side (molecule, ansible-playbook, docker) and in its containers,
    and the machine's busy CPU sampled every 10 s: printed at the end."""
    return CPU


@pytest.fixture(scope="session")
def figures():
    """{scenario: the figures its verify step's tests measured (suite_report.figures)}, printed at the end, passed
    or failed."""
    return FIGURES


@pytest.fixture(scope="session")
def failures():
    """{scenario: the lines of its failed step that say what failed}, repeated at the very end of the log."""
    return FAILURES


def load_table(samples, window=300.0):
    """Busy share of all cores per `window` seconds, from (seconds, busy, total) samples."""
    rows, start = [], 0
    for index, (stamp, busy, total) in enumerate(samples):
        if stamp - samples[start][0] >= window or index == len(samples) - 1 and index > start:
            first = samples[start]
            share = (busy - first[1]) / max(total - first[2], 1e-9)
            rows.append(f"{first[0] / 60:5.1f} -> {stamp / 60:5.1f} min   busy {100 * share:5.1f} %")
            start = index
    return rows


def pytest_terminal_summary(terminalreporter):
    """Each scenario's step times, and its converge vs no-op re-run (idempotence) ratio, measured in this run."""
    if not STEP_TIMES:
        return
    terminalreporter.section("molecule steps (this run, seconds)")
    steps = ["create", "prepare", "converge", "idempotence", "verify"]
    terminalreporter.write_line(f"{'scenario':18} " + " ".join(f"{step:>11}" for step in steps) + f" {'total':>8}")
    for name, times in STEP_TIMES.items():
        terminalreporter.write_line(f"{name:18} " + " ".join(f"{times.get(step, 0):11.1f}" for step in steps)
                                    + f" {sum(times.values()):8.1f}")
    terminalreporter.section("lanes (this run: start -> end, minutes after the first scenario started)")
    for name, (start, end) in sorted(TIMELINE.items(), key=lambda item: item[1][0]):
        terminalreporter.write_line(f"{name:18} {start / 60:6.1f} -> {(end or 0) / 60:6.1f}")
    if CPU["containers"]:
        terminalreporter.section("CPU time per scenario (this run, seconds)")
        terminalreporter.write_line(f"{'scenario':18} {'this machine':>12} {'containers':>11} {'total':>8}")
        for name, inside in CPU["containers"].items():
            host = CPU["host"].get(name, 0.0)
            terminalreporter.write_line(f"{name:18} {host:12.0f} {inside:11.0f} {host + inside:8.0f}")
    if len(CPU["load"]) > 1:
        terminalreporter.section("machine load (this run: busy share of all cores)")
        for row in load_table(CPU["load"]):
            terminalreporter.write_line(row)
    for name, lines in SLOWEST_TESTS.items():
        terminalreporter.section(f"slowest and heaviest (CPU) tests of {name}")
        for line in lines:
            terminalreporter.write_line(line)
    timed = {name: steps for name, steps in STEP_TIMES.items() if "idempotence" in steps}
    if timed:
        terminalreporter.section("converge vs no-op re-run (this run)")
    for name, steps in timed.items():
        converge, rerun = steps["converge"], steps["idempotence"]
        terminalreporter.write_line(f"{name:18} converge {converge:7.1f} s   no-op re-run {rerun:6.1f} s   "
                                    f"ratio {rerun / converge:.3f}")
    for name, lines in FIGURES.items():
        if lines:
            terminalreporter.section(f"figures measured by {name}'s tests (this run)")
            for line in lines:
                terminalreporter.write_line(line)
    for name, lines in FAILURES.items():
        terminalreporter.section(f"what failed in {name}")
        for line in lines:
            terminalreporter.write_line(line)
    # tools/test-suite.sh prints it again after the checks' log, at the end of make test's output: where CI's
    # excerpt of a failed run (its last lines) shows it.
    SUMMARY.write_text("".join(f"what failed in {name}:\n" + "".join(f"  {line}\n" for line in lines)
                               for name, lines in FAILURES.items()))
