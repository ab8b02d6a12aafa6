"""The converge: site.yml builds an older tree from git - verified commit, names and flags read from the tree,
built once for both nodes; this tree's llama-server serves without a worker that does not answer, and status.yml
names it (the upgrade tests then move this cluster to 0c1e570)."""

import json
import os
import re
import shlex
from pathlib import Path

import pytest
from cluster_helpers import RPC_PORT, SERVER_PORT, address, connect, run_playbook, stop_server_on, wait_health

COMMIT = os.environ["LLAMA_GIT_0_3_30_COMMIT"]
NODES = ("builder", "node")
# Wait for /health (up to 300 s: the suite's lanes load the machine), then ask (python3 in the container: no
# connection per poll).
ASK = """
import json, sys, time, urllib.request
deadline = time.monotonic() + 300
while True:
    try:
        urllib.request.urlopen("http://127.0.0.1:18301/health", timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("llama-server on port 18301 not healthy within 300 s")
        time.sleep(0.5)
body = json.dumps({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}).encode()
print(urllib.request.urlopen("http://127.0.0.1:18301/completion", body, timeout=60).read().decode())
"""


@pytest.fixture(scope="module", params=NODES)
def node(request):
    return connect(request.param)


def build_info(host):
    return json.loads(host.file("/opt/llama.cpp/current/BUILD-INFO.json").content_string)


def test_build_info_describes_the_tree(node):
    info = build_info(node)
    assert info["commit"] == COMMIT
    assert info["source"] == "git"
    assert len(info["source_sha256"]) == 64
    assert info["backend"] == "cpu"
    assert "-DGGML_RPC=ON" in info["cmake_args"]
    # Read from this older tree, not assumed: the worker binary's old name, protocol 4, the old mmap flag.
    assert info["rpc_server_binary"] == "rpc-server"
    assert info["rpc_proto"] == "4.0.1"
    assert info["no_mmap_args"] == ["--no-mmap"]


def test_binaries_run_and_report_the_commit(node):
    # Installed in a directory of its own, named by the build; current points at it.
    build_dir = f"/opt/llama.cpp/{build_info(node)['build_id']}"
    assert node.check_output("readlink -f /opt/llama.cpp/current") == build_dir
    bindir = f"{build_dir}/bin"
    assert node.file(f"{bindir}/rpc-server").is_file
    version = node.run(f"{bindir}/llama-server --version")
    assert COMMIT in version.stdout + version.stderr
    # The libraries come with the build (RPATH $ORIGIN/../lib): nothing is missing.
    assert "not found" not in node.check_output(f"ldd {bindir}/llama-server {bindir}/rpc-server")


def test_only_the_builder_has_a_toolchain(node):
    has_compiler = node.exists("cmake")
    assert has_compiler == (node.check_output("hostname") == "builder")


def test_compiled_once_for_both_nodes():
    ids = {build_info(connect(name))["build_id"] for name in NODES}
    assert len(ids) == 1
    ledger = Path(os.environ["LLAMA_ARTIFACT_CACHE"]) / "builds.log"
    compiled = [line for line in ledger.read_text().splitlines() if line.split()[1] in ids]
    assert len(compiled) == 1 and " compiled on builder " in compiled[0], compiled


def test_the_recorded_no_mmap_flag_serves_on_this_tree():
    """This tree knows --no-mmap and not --load-mode: the flag BUILD-INFO records (the one the llama-server
    unit gets for a model on a network filesystem) serves the real model; the newer flag is refused."""
    node = connect("node")
    server = "/opt/llama.cpp/current/bin/llama-server -m /srv/models/smollm2.gguf -c 512 --host 127.0.0.1"
    refused = node.run(f"timeout 30 {server} --port 18300 --load-mode none")
    assert refused.rc != 0 and "--load-mode" in refused.stdout + refused.stderr
    flags = " ".join(build_info(node)["no_mmap_args"])
    assert node.run(f"(timeout 420 {server} -t 1 --port 18301 {flags} > /tmp/no-mmap.log 2>&1 &)").rc == 0
    try:
        answer = node.run(f"python3 -c {shlex.quote(ASK)}")
        assert answer.rc == 0, answer.stderr + node.check_output("tail -n 30 /tmp/no-mmap.log")
        assert "Paris" in json.loads(answer.stdout)["content"], answer.stdout
    finally:
        stop_server_on(node, 18301)


@pytest.mark.parametrize("name, unit", [("builder", "llama-server.service"), ("node", "llama-rpc-server.service")])
def test_a_first_deploy_starts_each_service_once(name, unit):
    """Converge (a first deploy) and its no-op re-run: each service started once, the model loaded once."""
    host = connect(name)
    starts = host.check_output(f"journalctl -u {unit} -o cat --no-pager | grep -c '^Started {unit}' || true")
    assert starts == "1"


# On the worker's RPC address: answers one RPC handshake as this tree's server would (protocol 4.0.1), for the
# master's llama-wait-workers, then stops listening, so that llama-server's own connection is refused.
IMPOSTOR = """
import socket, struct, sys
listener = socket.create_server((sys.argv[1], int(sys.argv[2])))
connection, _ = listener.accept()
listener.close()
with connection:
    connection.recv(64)
    connection.sendall(struct.pack("<Q", 3) + bytes([4, 0, 1]))
"""


def test_a_master_serving_without_its_worker_is_named_by_status():
    """Trees of RPC protocol <= 5.1 start llama-server without a worker they cannot reach and serve on fewer devices,
    silently (LLAMACPP.md): status.yml fails and names the worker, the master and the fix; verify.yml fails too."""
    builder, node = connect("builder"), connect("node")
    worker = f"{address(node)}:{RPC_PORT}"
    # Only this test restarts llama-server meanwhile (the watch would restart it as soon as the worker went away).
    builder.check_output("systemctl stop llama-server-watch.service")
    node.check_output("systemctl stop llama-rpc-server.service")
    try:
        node.check_output(f"systemd-run --unit=rpc-impostor python3 -c {shlex.quote(IMPOSTOR)} {address(node)} "
                          f"{RPC_PORT}")
        listening = f"for i in $(seq 50); do ss -Hltn 'sport = :{RPC_PORT}' | grep -q . && exit 0; sleep 0.2; done"
        node.check_output(f"{listening}; exit 1")
        builder.check_output("systemctl restart llama-server.service")
        wait_health(builder, SERVER_PORT, timeout=300)
        journal = builder.check_output("journalctl -u llama-server.service -n 200 -o cat --no-pager")
        result = run_playbook("playbooks/status.yml", timeout=300)
        output = result.stdout + result.stderr
        verify = run_playbook("playbooks/verify.yml", timeout=300)
    finally:
        node.run("systemctl stop rpc-impostor.service; systemctl reset-failed rpc-impostor.service")
        node.check_output("systemctl start llama-rpc-server.service")
        builder.check_output("systemctl restart llama-server.service")
        builder.check_output("systemctl start llama-server-watch.service")
    assert f"Failed to connect to {worker}" in journal, journal[-3000:]
    assert result.returncode != 0, output[-3000:]
    assert re.search(rf"builder: llama-server serves without node \({re.escape(worker)}\): no connection, so on "
                     rf"fewer devices than planned \(0 of the 1 RPC workers of its plan\) \(fix: start the missing "
                     rf"RPC servers", output), output[-4000:]
    # verify.yml's drift check: the same finding, from the same code.
    verified = verify.stdout + verify.stderr
    assert verify.returncode != 0, verified[-3000:]
    assert re.search(rf"builder: llama-server serves without {re.escape(worker)}: no connection, so on fewer devices "
                     rf"than planned", verified), verified[-4000:]
    wait_health(builder, SERVER_PORT, timeout=300)
