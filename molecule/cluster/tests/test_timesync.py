"""playbooks/timesync.yml on the air-gapped cluster (llama_time_airgapped): the master is the workers' only time
source (molecule/chrony: the role with a time server of its own)."""

import pytest
from chrony_checks import RUNNER, address_of, directives, wait_for_source

testinfra_hosts = RUNNER.get_hosts("llama_master") + RUNNER.get_hosts("llama_workers")
DROPIN = "/etc/systemd/system/chrony.service.d/no-clock-control.conf"
DIRECTIVES = ("server", "pool", "allow", "local")


def is_master(host):
    return "llama_master" in host.ansible.get_variables()["group_names"]


def test_master_serves_the_workers(host):
    if not is_master(host):
        pytest.skip("master only")
    workers = sorted(address_of(name) for name in RUNNER.get_hosts("llama_workers"))
    assert sorted(directives(host, DIRECTIVES)) == sorted([f"allow {a}/32" for a in workers] + ["local stratum 10"])


def test_workers_use_only_the_master(host):
    if is_master(host):
        pytest.skip("workers only")
    assert directives(host, DIRECTIVES) == [f"server {address_of('master')} iburst"]


def test_chronyd_runs_without_clock_control(host):
    """No CAP_SYS_TIME in the containers: the drop-in lifts the unit's condition and adds -x."""
    dropin = host.file(DROPIN).content_string
    assert "ConditionCapability=\n" in dropin
    assert host.service("chrony").is_running
    assert all("-x" in p.args.split() for p in host.process.filter(comm="chronyd"))


def test_worker_follows_the_master(host):
    """The master is reachable and selected (*) or combined (+) (chrony_checks.wait_for_source: within 200 s)."""
    if is_master(host):
        pytest.skip("workers only")
    wait_for_source(host, address_of("master"))
