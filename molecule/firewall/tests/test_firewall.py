"""The converged hosts: each worker admits its RPC port from the master only, whatever its firewall; the
master's API is open; the rules of others are still there and still work."""

import json
import os
from pathlib import Path

import pytest
from cluster_helpers import RPC_PORT, SERVER_PORT, address
from conftest import BACKEND, WORKERS, tcp_connect

FOREIGN_PORT = 9999  # prepare.yml: the master's table inet foreign drops it


def record(host):
    return json.loads(host.file("/etc/llama.cpp/firewall-rules.json").content_string)


@pytest.mark.parametrize("name", WORKERS)
def test_a_stranger_is_dropped(name, listening, stranger):
    """The packets are dropped (a timeout), not refused: nothing of the worker answers the stranger."""
    assert tcp_connect(stranger, listening[name], RPC_PORT) == "timeout"


@pytest.mark.parametrize("name", WORKERS)
def test_the_master_is_admitted(name, listening, master):
    assert tcp_connect(master, listening[name], RPC_PORT) == "connected"


@pytest.mark.parametrize("name", WORKERS)
def test_the_worker_reaches_itself(name, listening, workers):
    """Loopback is admitted (a host in both groups dials its own RPC server)."""
    assert tcp_connect(workers[name], listening[name], RPC_PORT) == "connected"


METRICS_PORT = 9100  # llama_metrics_port's default


@pytest.mark.parametrize("name", WORKERS)
def test_the_exporter_port_admits_the_monitor_only(name, workers, master, stranger):
    """llama_metrics: node-exporter's port admits the llama_monitor host (the master here) and drops the stranger,
    whatever the firewall (probed with a plain listener: this scenario installs no exporter)."""
    host = workers[name]
    unit = "test-exporter-port"
    host.run(f"systemctl reset-failed {unit}")
    assert host.run(f"systemd-run --unit {unit} python3 -m http.server {METRICS_PORT} --bind {address(host)}").rc == 0
    try:
        assert host.run(f"for i in $(seq 50); do ss -Hltn 'sport = :{METRICS_PORT}' | grep -q . && exit 0; "
                        "sleep 0.2; done; exit 1").rc == 0
        assert tcp_connect(master, address(host), METRICS_PORT) == "connected"
        assert tcp_connect(stranger, address(host), METRICS_PORT) == "timeout"
    finally:
        host.run(f"systemctl stop {unit}")


@pytest.mark.parametrize("name", WORKERS)
def test_each_worker_uses_its_backend(name, workers):
    """worker_nft: auto, nothing active, so nftables; worker_fwd and worker_ufw: named in the inventory, installed
    and turned on by the role."""
    host = workers[name]
    assert record(host)["backend"] == BACKEND[name]
    active = {
        "nftables": "systemctl is-active llama-firewall.service && nft list table inet llama_cluster",
        "firewalld": "firewall-cmd --state",
        "ufw": "ufw status | grep -qx 'Status: active'",
    }
    assert host.run(active[BACKEND[name]]).rc == 0
    # One firewall: the others are not running, and no table of ours sits next to firewalld or ufw.
    if BACKEND[name] != "nftables":
        assert host.run("nft list table inet llama_cluster").rc != 0
        assert not host.file("/etc/systemd/system/llama-firewall.service").exists


def test_the_api_is_open_and_the_foreign_rule_still_drops(master, stranger):
    """The master admits llama_server_port from anywhere (llama_server_allowed_sources: []); someone else's table
    still drops its port."""
    ports = {"api": SERVER_PORT, "foreign": FOREIGN_PORT}
    try:
        for name, port in ports.items():
            assert master.run(f"systemd-run --unit test-{name} python3 -m http.server {port}").rc == 0
        for port in ports.values():
            assert master.run(f"for i in $(seq 50); do ss -Hltn 'sport = :{port}' | grep -q . && exit 0; "
                              "sleep 0.2; done; exit 1").rc == 0
        assert tcp_connect(stranger, address(master), SERVER_PORT) == "connected"
        assert tcp_connect(stranger, address(master), FOREIGN_PORT) == "timeout"
    finally:
        for name in ports:
            master.run(f"systemctl stop test-{name}")
    assert "someone else's rule" in master.check_output("nft list table inet foreign")


def test_the_master_admits_ntp_from_the_workers_only(master, workers):
    """Air-gapped, the master serves time: NTP admitted from the workers (the rule a default-deny backend needs)."""
    lines = master.check_output("nft list table inet llama_cluster").splitlines()
    admit = [line for line in lines if "udp dport 123 accept" in line]
    assert len(admit) == 1 and all(address(host) in admit[0] for host in workers.values()), lines
    assert any("udp dport 123 drop" in line for line in lines), lines


def test_check_mode_on_fresh_hosts_said_what_it_would_install():
    """prepare.yml ran the converge with --check --diff on the fresh hosts: it passed and named the packages."""
    log = " ".join((Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "check-fresh.log").read_text().split())
    for name, package in BACKEND.items():
        assert f"{name} would install {package}" in log
