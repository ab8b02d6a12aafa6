"""The firewall scenario's fixtures and probes; shared helpers come from molecule/shared/cluster_helpers.py."""

import time
from shlex import quote

import pytest
from cluster_helpers import RPC_PORT, address, connect, master, order_tests  # noqa: F401 (master: a fixture)

WORKERS = ("worker_nft", "worker_fwd", "worker_ufw")
BACKEND = {"worker_nft": "nftables", "worker_fwd": "firewalld", "worker_ufw": "ufw"}
# What the workers' RPC port is probed with: a listener in the unit the RPC server would run in (the preflight
# accepts a port held by llama-rpc-server.service: it is the cluster's own).
LISTENER = "llama-rpc-server"
CONNECT_TIMEOUT = 3

# Behaviour of the converged hosts first; then the runs and restarts that change them; decommission last.
ORDER = ["test_firewall.py", "test_network.py", "test_reboot.py", "test_master_moves.py", "test_bad_input.py",
         "test_firewall_none.py", "test_decommission.py"]

PROBE = """
import socket, sys
target, port, source, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
sock = socket.socket()
sock.settimeout(timeout)
if source:
    sock.bind((source, 0))
try:
    sock.connect((target, port))
    print("connected")
except socket.timeout:
    print("timeout")
except OSError as error:
    print(f"error {error.errno} {error.strerror}")
"""


def pytest_collection_modifyitems(items):
    order_tests(items, ORDER)


def tcp_connect(host, target, port, source="", timeout=CONNECT_TIMEOUT):
    """`connected`, `timeout` (dropped on the way) or `error <errno> <reason>`, of a TCP connect made on `host`."""
    result = host.run(f"python3 -c {quote(PROBE)} {target} {port} {quote(source)} {timeout}")
    assert result.rc == 0, result.stderr
    return result.stdout.strip()


def start_listener(host, port=RPC_PORT):
    """A TCP listener on the host's cluster address and `port`, until it stops (or the container restarts)."""
    if host.run(f"systemctl is-active --quiet {LISTENER}").rc != 0:
        host.run(f"systemctl reset-failed {LISTENER}")
        command = f"systemd-run --unit {LISTENER} python3 -m http.server {port} --bind {address(host)}"
        assert host.run(command).rc == 0
    deadline = time.monotonic() + 20
    while host.run(f"ss -Hltn 'sport = :{port}' | grep -q .").rc != 0:
        assert time.monotonic() < deadline, f"nothing listens on port {port} after 20 s"
        time.sleep(0.3)


@pytest.fixture(scope="session")
def stranger():
    return connect("stranger")


@pytest.fixture(scope="session")
def workers():
    return {name: connect(name) for name in WORKERS}


@pytest.fixture()
def listening(workers):
    """Every worker's RPC port has a listener (restarted containers lose theirs)."""
    for host in workers.values():
        start_listener(host)
    return {name: address(host) for name, host in workers.items()}
