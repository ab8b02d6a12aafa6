"""The chrony role: a time server with a local reference and a client that follows it."""

import pytest
from chrony_checks import RUNNER, address_of, directives, wait_for_source

testinfra_hosts = RUNNER.get_hosts("all")
DIRECTIVES = ("server", "pool", "allow", "local", "makestep")


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
    assert directives(host, DIRECTIVES) == expected


def test_client_reaches_timeserver(host):
    if host.backend.get_hostname() != "client":
        pytest.skip("the client measures the timeserver")
    wait_for_source(host, address_of("timeserver"), states=("*", "+"))


def test_tracking_answers(host):
    tracking = host.check_output("chronyc -n tracking")
    assert "Stratum" in tracking
    if host.backend.get_hostname() == "timeserver":
        assert "Stratum         : 10" in tracking
