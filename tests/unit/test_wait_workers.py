"""llama-wait-workers (roles/llama_server/files) as its callers use it: the llama-server unit reads its messages in
the journal, llama-bench's callers parse the JSON the command after `--` prints. The peer here answers HELLO as
ggml-rpc-server does (u64 size, then major, minor, patch); the real RPC servers are dialled by the cluster, tls and
vulkan scenarios."""

import socket
import struct
import subprocess
import sys
import threading

import pytest
from conftest import ROOT

SCRIPT = ROOT / "roles" / "llama_server" / "files" / "llama-wait-workers"


@pytest.fixture
def rpc_peer():
    """A listener that answers each HELLO with protocol version `version` (settable), and what it was sent."""
    listener = socket.create_server(("127.0.0.1", 0))
    state = {"version": (7, 0, 0), "requests": []}

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                request = b""
                while len(request) < 33:
                    chunk = conn.recv(64)
                    if not chunk:
                        break
                    request += chunk
                state["requests"].append(request)
                conn.sendall(struct.pack("<Q", 3) + bytes(state["version"]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    state["endpoint"] = "127.0.0.1:%d" % listener.getsockname()[1]
    yield state
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
    listener.close()
    thread.join(5)


def wait_workers(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_the_command_after_the_wait_owns_stdout(rpc_peer):
    result = wait_workers("--protocol", "7", "10", f"worker1={rpc_peer['endpoint']}", "--",
                          sys.executable, "-c", "print('{\"t/s\": 1.5}')")
    assert result.returncode == 0, result.stderr
    # llama-bench's JSON is parsed from stdout: the wait's own messages must not precede it.
    assert result.stdout == '{"t/s": 1.5}\n'
    assert f"worker worker1 ({rpc_peer['endpoint']}) answers (RPC protocol 7.0.0)" in result.stderr
    # The request is HELLO (14) with an empty 24-byte capabilities payload.
    assert rpc_peer["requests"] == [struct.pack("<BQ", 14, 24) + bytes(24)]


def test_a_worker_of_another_protocol_is_waited_for_then_named(rpc_peer):
    rpc_peer["version"] = (6, 1, 0)
    result = wait_workers("--protocol", "7", "1", f"worker2={rpc_peer['endpoint']}", "--", "true")
    assert result.returncode == 1
    assert result.stdout == ""
    assert (f"worker worker2 ({rpc_peer['endpoint']}): it speaks RPC protocol 6.1.0, this master 7.x (an upgrade "
            "switching it is waited for) for 1s; giving up: run upgrade.yml" in result.stderr)
    assert len(rpc_peer["requests"]) > 1  # asked again until the timeout


def test_a_worker_switched_to_the_protocol_meanwhile_is_taken(rpc_peer):
    """upgrade.yml switches every node at once: the new master may ask a worker before its switch."""
    rpc_peer["version"] = (6, 1, 0)
    waiting = subprocess.Popen([sys.executable, str(SCRIPT), "--protocol", "7", "30",
                                f"worker1={rpc_peer['endpoint']}"], stderr=subprocess.PIPE, text=True)
    first = waiting.stderr.readline()
    assert "it speaks RPC protocol 6.1.0" in first
    rpc_peer["version"] = (7, 0, 0)
    assert waiting.wait(timeout=30) == 0
    assert "answers (RPC protocol 7.0.0)" in waiting.stderr.read()


def test_a_silent_worker_is_named_when_the_wait_gives_up():
    with socket.create_server(("127.0.0.1", 0)) as busy:  # accepts into its queue, never answers
        endpoint = "127.0.0.1:%d" % busy.getsockname()[1]
        result = wait_workers("1", f"worker3={endpoint}", "--", "true")
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"worker worker3 ({endpoint}): no answer to the RPC handshake (timed out) for 1s; giving up" in result.stderr
