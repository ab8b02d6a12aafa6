"""The session guard's primitives (roles/llama_rpc/files/llama-rpc-session) against the real kernel: TCP counters
read over sock_diag, a process found blocked on a full pipe, and the gate that holds a writer. The guard itself,
around real RPC servers, is tested by the cluster and vulkan scenarios."""

import importlib.machinery
import importlib.util
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import ROOT

LOADER = importlib.machinery.SourceFileLoader("llama_rpc_session",
                                              str(ROOT / "roles" / "llama_rpc" / "files" / "llama-rpc-session"))
SPEC = importlib.util.spec_from_loader("llama_rpc_session", LOADER)
guard = importlib.util.module_from_spec(SPEC)
LOADER.exec_module(guard)


def wait_for(predicate, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def connection():
    """Both ends of a loopback TCP connection, and the listening socket."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        yield client, server
        client.close()
        server.close()


def transfer(client, server, size):
    """`size` bytes from the client's end, all received at the server's."""
    client.sendall(b"x" * size)
    received = 0
    while received < size:
        received += len(server.recv(1 << 16))


def test_tcp_connections_reads_the_kernel_state_and_counters_of_each_connection(connection):
    client, server = connection
    transfer(client, server, 100_000)
    counters = guard.tcp_connections()
    assert counters[os.fstat(server.fileno()).st_ino] == (guard.TCP_ESTABLISHED, 100_000)
    assert counters[os.fstat(client.fileno()).st_ino] == (guard.TCP_ESTABLISHED, 0)
    assert guard.connected(os.getpid())
    client.close()  # the server's end is then in CLOSE_WAIT: no longer connected, though the socket is held
    assert wait_for(lambda: not guard.connected(os.getpid()))
    assert os.fstat(server.fileno()).st_ino in guard.socket_inodes(os.getpid())


def test_connection_bytes_counts_only_the_process_own_connections(connection):
    client, server = connection
    transfer(client, server, 70_000)
    assert guard.connection_bytes(os.getpid()) == 70_000  # both ends are this process's
    idle = subprocess.Popen(["sleep", "10"])
    try:
        assert guard.connection_bytes(idle.pid) == 0
    finally:
        idle.kill()
        idle.wait()


def complete_lines(server):
    """The next complete lines (a read may end inside a line)."""
    found = []
    while not found:
        found = server.lines(block=True)
    return found


def test_a_writer_is_held_by_the_closed_gate_and_let_through_when_it_opens():
    """The gate: the pipe filled to its last byte holds the writer in write(2) (blocked_writing), draining the
    filler lets its line through, whole and in order."""
    command = [sys.executable, "-c",
               "import sys, time; print('Accepted client connection', flush=True); time.sleep(0.3);"
               " print('Client connection closed', flush=True); time.sleep(30)"]
    server = guard.Server(command)
    try:
        assert complete_lines(server) == [b"Accepted client connection"]
        server.close_gate()
        assert server.filled > 0
        assert wait_for(lambda: guard.blocked_writing(server.proc.pid)), "the writer was not held"
        assert server.open_gate() == []
        assert wait_for(lambda: not guard.blocked_writing(server.proc.pid))
        assert complete_lines(server) == [b"Client connection closed"]
        assert server.filled == 0
    finally:
        server.stop()


def test_a_process_sleeping_elsewhere_is_not_blocked_writing():
    sleeper = subprocess.Popen(["sleep", "10"])
    try:
        assert wait_for(lambda: (guard.read_proc(sleeper.pid, "wchan") or b"") not in (b"", b"0"))
        assert not guard.blocked_writing(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
