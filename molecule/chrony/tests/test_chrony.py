"""The chrony role: a time server with a local reference and a client that follows it."""

import os
import time

import pytest
import testinfra.utils.ansible_runner

RUNNER = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"])
testinfra_hosts = RUNNER.get_hosts("all")

CONFIG = "/etc/chrony/chrony.conf"
DIRECTIVES = ("server", "pool", "allow", "local", "makestep")


def address_of(name):
    """The IPv4 address of the instance's default interface (what ansible_default_ipv4 reports)."""
    addresses = RUNNER.get_host(name).interface.default("inet").addresses
    return next(address for address in addresses if "." in address)


def directives(host):
    """The config lines that choose time sources and clients, in order."""
    lines = host.file(CONFIG).content_string.splitlines()
    return [line.strip() for line in lines if line.strip().split(" ", 1)[0] in DIRECTIVES]


def sources(host):
    """`chronyc -c -n sources` as dicts: mode, state, address, stratum, reach (octal register)."""
    output = host.check_output("chronyc -c -n sources")
    rows = [line.split(",") for line in output.splitlines() if line]
    return [{"mode": r[0], "state": r[1], "address": r[2], "stratum": int(r[3]), "reach": int(r[5], 8)}
            for r in rows]


def wait_for_source(host, address, states, timeout=70):
    """Poll until `address` answers (reach != 0) in one of `states`; 70 s covers one 64 s poll after iburst."""
    deadline = time.monotonic() + timeout
    while True:
        current = sources(host)
        if any(s["address"] == address and s["reach"] and s["state"] in states for s in current):
            return current
        if time.monotonic() > deadline:
            pytest.fail(f"{address} not reachable in state {states} after {timeout}s: {current}")
        time.sleep(2)


def test_package_installed(host):
    assert host.package("chrony").is_installed


def test_service_enabled_and_running(host):
    service = host.service("chrony")
    assert service.is_enabled
    assert service.is_running


def test_chronyd_runs_without_clock_control(host):
    """Containers have no CAP_SYS_TIME: every chronyd process carries -x."""
    processes = host.process.filter(comm="chronyd")
    assert processes
    assert all("-x" in p.args.split() for p in processes)


def test_config_directives(host):
    name = host.backend.get_hostname()
    makestep = "makestep 1.0 3"
    if name == "timeserver":
        expected = [makestep, f"allow {address_of('client')}", "local stratum 10"]
    else:
        expected = [f"server {address_of('timeserver')} iburst", makestep]
    assert directives(host) == expected


def test_client_reaches_timeserver(host):
    if host.backend.get_hostname() != "client":
        pytest.skip("the client measures the timeserver")
    wait_for_source(host, address_of("timeserver"), states=("*", "+"))


def test_tracking_answers(host):
    tracking = host.check_output("chronyc -n tracking")
    assert "Stratum" in tracking
    if host.backend.get_hostname() == "timeserver":
        assert "Stratum         : 10" in tracking
