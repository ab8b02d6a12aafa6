"""playbooks/timesync.yml, air-gapped: the master is the workers' only time source."""

import os
import time

import pytest
import testinfra.utils.ansible_runner

RUNNER = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"])
testinfra_hosts = RUNNER.get_hosts("all")

CONFIG = "/etc/chrony/chrony.conf"
DROPIN = "/etc/systemd/system/chrony.service.d/no-clock-control.conf"
DIRECTIVES = ("server", "pool", "allow", "local")


def address_of(name):
    """The IPv4 address of the instance's default interface (the play's default cluster address)."""
    addresses = RUNNER.get_host(name).interface.default("inet").addresses
    return next(address for address in addresses if "." in address)


def directives(host):
    """The config lines that choose time sources and clients, in order."""
    lines = host.file(CONFIG).content_string.splitlines()
    return [line.strip() for line in lines if line.strip().split(" ", 1)[0] in DIRECTIVES]


def sources(host):
    """`chronyc -c -n sources` as dicts: state, address, reach (octal register)."""
    output = host.check_output("chronyc -c -n sources")
    rows = [line.split(",") for line in output.splitlines() if line]
    return [{"state": r[1], "address": r[2], "reach": int(r[5], 8)} for r in rows]


def is_master(host):
    return "llama_master" in host.ansible.get_variables()["group_names"]


def test_master_serves_the_workers(host):
    if not is_master(host):
        pytest.skip("master only")
    workers = sorted(address_of(name) for name in RUNNER.get_hosts("llama_workers"))
    assert sorted(directives(host)) == sorted([f"allow {a}/32" for a in workers] + ["local stratum 10"])


def test_workers_use_only_the_master(host):
    if is_master(host):
        pytest.skip("workers only")
    assert directives(host) == [f"server {address_of('master')} iburst"]


def test_chronyd_runs_without_clock_control(host):
    """No CAP_SYS_TIME in the containers: the drop-in lifts the unit's condition and adds -x."""
    dropin = host.file(DROPIN).content_string
    assert "ConditionCapability=\n" in dropin
    assert host.service("chrony").is_running
    assert all("-x" in p.args.split() for p in host.process.filter(comm="chronyd"))


def test_worker_follows_the_master(host):
    """The master is reachable and selected (*) or combined (+) within 70 s (one 64 s poll after iburst)."""
    if is_master(host):
        pytest.skip("workers only")
    master, deadline = address_of("master"), time.monotonic() + 70
    while True:
        current = sources(host)
        if any(s["address"] == master and s["reach"] and s["state"] in ("*", "+") for s in current):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"master {master} not selected after 70s: {current}")
        time.sleep(2)
