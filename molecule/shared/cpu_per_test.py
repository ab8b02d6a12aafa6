"""A pytest plugin of the verify steps (molecule's verifier loads it with -p): the CPU time each test used, this
machine's side (the test process and the programs it ran and waited for: ansible-playbook, ssh, docker) and the
scenario's containers (their cgroups), for the heaviest tests in the suite's summary. The suite is CPU-bound: its
length is the sum of this over all tests divided by the cores, so these figures, not durations, say what to cut."""

import os
import resource

import pytest
from cgroup_cpu import container_ids, containers_cpu

SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "")
SHOWN = 12
USED = {}
CONTAINERS = []  # the scenario's container ids, read once (no `docker ps` around every test)


def _host_cpu():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_sessionstart():
    CONTAINERS.extend(container_ids(SCENARIO))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    host, inside = _host_cpu(), containers_cpu(SCENARIO, CONTAINERS)
    yield
    USED[item.nodeid] = (_host_cpu() - host, containers_cpu(SCENARIO, CONTAINERS) - inside)


def pytest_terminal_summary(terminalreporter):
    if not USED:
        return
    terminalreporter.section("CPU per test (seconds: this machine + containers)")
    total = sum(host + inside for host, inside in USED.values())
    for nodeid, (host, inside) in sorted(USED.items(), key=lambda item: -sum(item[1]))[:SHOWN]:
        terminalreporter.write_line(f"{host + inside:.1f} cpu-s ({host:.1f} + {inside:.1f}) {nodeid}")
    terminalreporter.write_line(f"{total:.1f} cpu-s in all, {len(USED)} tests")
