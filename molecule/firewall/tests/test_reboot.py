"""The rules persist: Debian's nftables.service flushing the ruleset (start, restart, reload, stop) leaves the
cluster's table loaded; after a restart of the workers' containers (systemd boots again, the kernel's ruleset
starts empty) each firewall admits the master and drops the stranger as before."""

import subprocess
import time

import pytest
from cluster_helpers import RPC_PORT, container
from conftest import BACKEND, WORKERS, tcp_connect


def test_nftables_service_does_not_wipe_the_table(workers, listening, master, stranger):
    """worker_nft: nftables.service (installed with the package, off) turned on, restarted, reloaded and off again.
    Each flushes the whole ruleset (Docker's DNS redirection too, until the reboot below)."""
    host = workers["worker_nft"]
    for action in ("start", "restart", "reload", "stop"):
        assert host.run(f"systemctl {action} nftables.service").rc == 0
        assert host.run("nft list table inet llama_cluster").rc == 0, f"table gone after {action}"
    assert tcp_connect(stranger, listening["worker_nft"], RPC_PORT) == "timeout"
    assert tcp_connect(master, listening["worker_nft"], RPC_PORT) == "connected"


@pytest.fixture(scope="module")
def rebooted(workers):
    subprocess.run(["docker", "restart", "--time", "5", *(container(name) for name in WORKERS)], check=True,
                   capture_output=True, timeout=300)
    for host in workers.values():
        deadline = time.monotonic() + 90
        # Until its SSH server answers (testinfra raises on ssh's own failures), and systemd answers on its bus (right
        # after the start, `systemctl` cannot connect yet).
        state = None
        while state not in ("running", "degraded"):
            assert time.monotonic() < deadline, f"{host.backend.name}: systemd is {state!r} 90 s after the restart"
            try:
                state = host.run("systemctl is-system-running --wait").stdout.strip()
            except RuntimeError as error:
                state = f"unreachable ({error})"
            time.sleep(1)
    return workers


@pytest.mark.parametrize("name", WORKERS)
def test_after_a_reboot(name, rebooted, listening, master, stranger):
    assert tcp_connect(stranger, listening[name], RPC_PORT) == "timeout"
    assert tcp_connect(master, listening[name], RPC_PORT) == "connected"


@pytest.mark.parametrize("name", WORKERS)
def test_the_firewall_started_at_boot(name, rebooted):
    unit = {"nftables": "llama-firewall.service", "firewalld": "firewalld.service", "ufw": "ufw.service"}[BACKEND[name]]
    assert rebooted[name].run(f"systemctl is-active {unit}").stdout.strip() == "active"
