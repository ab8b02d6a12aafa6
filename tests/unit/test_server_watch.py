"""llama-server-watch (roles/llama_server/files) against real processes and a real TCP connection in CLOSE-WAIT.

systemd cannot run on this host (the molecule scenarios run it: upgrade's test_the_cluster_heals_itself); here a
`systemctl` first in PATH answers the two calls the watch makes, from files: `show -p MainPID --value` prints the
PID the test names, `restart` is written down. The "llama-server" is a process of that name holding a connection to
its `--rpc` endpoint; the test closes the far end, as a killed worker does."""

import os
import socket
import subprocess
import time

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs llama-server's stand-in as another user: needs root")

SCRIPT = ROOT / "roles" / "llama_server" / "files" / "llama-server-watch"

SYSTEMCTL = """#!/bin/sh
case "$1" in
  show) cat "{state}/mainpid" ;;
  restart) echo "$2" >> "{state}/restarts" ;;
esac
"""

# The master: connects to its --rpc endpoint and holds the connection without reading, as an idle llama-server.
LLAMA_SERVER = """
import socket, sys, time
host, port = sys.argv[sys.argv.index("--rpc") + 1].rsplit(":", 1)
connection = socket.create_connection((host, int(port)))
time.sleep(600)
"""


def llama_server(endpoint, delay=0):
    """A process whose command line is llama-server's (argv[0] .../llama-server, then --rpc ENDPOINT) after `delay`
    seconds under another one (bash's, without the endpoint), as systemd's child is before its exec; as the service
    user does, it runs as a user of its own (nobody; the watch and the tests' probes are root's)."""
    def demote():
        os.setgid(65534)
        os.setuid(65534)

    return subprocess.Popen(["bash", "-c", 'sleep "$DELAY"; exec -a /opt/llama.cpp/current/bin/llama-server '
                             '"$PYTHON" -c "$CODE" --rpc "$ENDPOINT" --port 8081'], preexec_fn=demote, cwd="/",
                            env=dict(os.environ, DELAY=str(delay), PYTHON="/usr/bin/python3", CODE=LLAMA_SERVER,
                                     ENDPOINT=endpoint))


@pytest.fixture
def world(tmp_path):
    state, bin_dir = tmp_path / "state", tmp_path / "bin"
    state.mkdir()
    bin_dir.mkdir()
    (state / "mainpid").write_text("0\n")
    (bin_dir / "systemctl").write_text(SYSTEMCTL.format(state=state))
    (bin_dir / "systemctl").chmod(0o755)
    worker = socket.create_server(("127.0.0.1", 0))
    # The watch, checking every second, with the stand-in systemctl first in PATH.
    processes = [subprocess.Popen(["bash", str(SCRIPT), "1"],
                                  env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"))]
    yield {"state": state, "worker": worker, "processes": processes}
    for process in processes:
        process.kill()
        process.wait()
    worker.close()


def restarts(world):
    path = world["state"] / "restarts"
    return path.read_text().split() if path.exists() else []


def test_a_worker_closing_its_end_restarts_the_master(world):
    endpoint = f"127.0.0.1:{world['worker'].getsockname()[1]}"
    # As systemd starts a unit: the main PID is named at the fork, then the child sets up its sandbox (here 3 s, two
    # of the watch's rounds) and execs llama-server. A watch that took the PID's command line during those seconds
    # (no --rpc yet) watched nothing for as long as that llama-server ran (the flaky self-healing test).
    master = llama_server(endpoint, delay=3)
    world["processes"].append(master)
    (world["state"] / "mainpid").write_text(f"{master.pid}\n")
    connection, _ = world["worker"].accept()
    time.sleep(2.5)  # the watch's rounds see the connection established: nothing to do
    assert restarts(world) == []
    connection.close()  # the worker went away: the master's end is in CLOSE-WAIT
    deadline = time.monotonic() + 10
    while not restarts(world):
        assert time.monotonic() < deadline, "the watch did not restart llama-server within 10 s of the close"
        time.sleep(0.1)
    assert restarts(world) == ["llama-server.service"]


def test_other_connections_closed_by_their_peer_are_not_a_worker_gone(world):
    stranger = socket.create_server(("127.0.0.1", 0))
    master = llama_server(f"127.0.0.1:{world['worker'].getsockname()[1]}")
    world["processes"].append(master)
    (world["state"] / "mainpid").write_text(f"{master.pid}\n")
    kept, _ = world["worker"].accept()  # the master's connection, open
    held = socket.create_connection(stranger.getsockname())
    stranger.accept()[0].close()  # a connection to another port, closed by its peer: CLOSE-WAIT too
    time.sleep(3.5)
    for sock in (held, stranger, kept):
        sock.close()
    assert restarts(world) == []


def test_another_process_s_connection_to_a_worker_closed_by_it_is_not_llama_server_s(world):
    """A probe of the worker's port by another user's process (status.yml's, root's), closed by the worker first:
    CLOSE-WAIT to the very endpoint, but not llama-server's connection, which stays open."""
    endpoint = f"127.0.0.1:{world['worker'].getsockname()[1]}"
    master = llama_server(endpoint)
    world["processes"].append(master)
    (world["state"] / "mainpid").write_text(f"{master.pid}\n")
    kept, _ = world["worker"].accept()
    probe = socket.create_connection(world["worker"].getsockname())  # this test's process, not llama-server
    world["worker"].accept()[0].close()
    time.sleep(3.5)
    for sock in (probe, kept):
        sock.close()
    assert restarts(world) == []
