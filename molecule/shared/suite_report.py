"""A pytest plugin of the verify steps (molecule's verifier loads it with -p), for the suite's summary:
- the CPU time each test used, this machine's side (the test process and the programs it ran and waited for:
  ansible-playbook, ssh, docker) and the scenario's containers (their cgroups), for the heaviest tests. The suite
  is CPU-bound: its length is the sum of this over all tests divided by the cores, so these figures, not
  durations, say what to cut;
- the figures tests measure (`figures(title, lines)`: latencies through restarts, load times, speeds), printed
  at the end of the verify step and by the suite's summary, whether the scenario passes or fails.
"""

import os
import resource

import pytest
from cgroup_cpu import container_ids, containers_cpu

SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "")
SHOWN = 12
USED = {}
FIGURES = []  # (test, title, lines)
PREFIX = "figure: "
CONTAINERS = []  # the scenario's container ids, read once (no `docker ps` around every test)


def children_cpu():
    """CPU seconds of the programs this process ran and waited for (ansible-playbook, ssh, docker)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


def _host_cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + children_cpu()


def scenario_cpu():
    """CPU seconds of the scenario's containers so far (their ids read once, where this plugin runs)."""
    return containers_cpu(SCENARIO, CONTAINERS or None)


def pytest_sessionstart():
    CONTAINERS.extend(container_ids(SCENARIO))


def figures(title, lines):
    """Record a test's measured figures (a title, then one line each) for the summaries; returns the lines."""
    FIGURES.append((os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0], title, list(lines)))
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    host, inside = _host_cpu(), scenario_cpu()
    yield
    USED[item.nodeid] = (_host_cpu() - host, scenario_cpu() - inside)


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("figures measured")
        for test, title, lines in FIGURES:
            terminalreporter.write_line(f"{PREFIX}{title} ({test.rsplit('/', 1)[-1]})")
            for line in lines:
                terminalreporter.write_line(f"{PREFIX}  {line}")
    if not USED:
        return
    terminalreporter.section("CPU per test (seconds: this machine + containers)")
    total = sum(host + inside for host, inside in USED.values())
    for nodeid, (host, inside) in sorted(USED.items(), key=lambda item: -sum(item[1]))[:SHOWN]:
        terminalreporter.write_line(f"{host + inside:.1f} cpu-s ({host:.1f} + {inside:.1f}) {nodeid}")
    terminalreporter.write_line(f"{total:.1f} cpu-s in all, {len(USED)} tests")
    # Every test's figures, for a closer look at where a scenario's CPU goes: LLAMA_CPU_REPORT=file (appended).
    if os.environ.get("LLAMA_CPU_REPORT"):
        with open(os.environ["LLAMA_CPU_REPORT"], "a", encoding="utf-8") as report:
            for nodeid, (host, inside) in sorted(USED.items(), key=lambda item: -sum(item[1])):
                report.write(f"{SCENARIO} {host + inside:.1f} {host:.1f} {inside:.1f} {nodeid}\n")
