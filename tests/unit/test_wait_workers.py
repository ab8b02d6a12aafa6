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


def test_a_worker_of_another_protocol_is_refused_at_once(rpc_peer):
    rpc_peer["version"] = (6, 1, 0)
    result = wait_workers("--protocol", "7", "300", f"worker2={rpc_peer['endpoint']}", "--", "true")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "worker worker2" in result.stderr and "speaks RPC protocol 6.1.0, this master 7.x" in result.stderr
    assert "upgrade.yml" in result.stderr


def test_a_silent_worker_is_named_when_the_wait_gives_up():
    with socket.create_server(("127.0.0.1", 0)) as busy:  # accepts into its queue, never answers
        endpoint = "127.0.0.1:%d" % busy.getsockname()[1]
        result = wait_workers("1", f"worker3={endpoint}", "--", "true")
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"worker worker3 ({endpoint}) did not answer the RPC handshake within 1s" in result.stderr
