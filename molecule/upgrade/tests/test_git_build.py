"""The converge: site.yml builds an older tree from git - verified commit, names and flags read from the tree,
built once for both nodes; a master without its worker refuses to start even on this tree, one that lost it is named
by status.yml and verify.yml (the upgrade tests then move this cluster to 0c1e570)."""

import json
import os
import re
import shlex
import time
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


def journal(host, unit="llama-server.service", since="-10min"):
    return host.check_output(f"journalctl -u {unit} --since {since} -o cat --no-pager")


def poll(what, check, timeout=120):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.5)
    return value


def status_and_verify():
    """(status.yml's output, verify.yml's output); both must fail."""
    outputs = []
    for playbook in ("playbooks/status.yml", "playbooks/verify.yml"):
        result = run_playbook(playbook, timeout=300)
        output = result.stdout + result.stderr
        assert result.returncode != 0, output[-3000:]
        outputs.append(output)
    return outputs


@pytest.fixture()
def without_the_watch():
    """The master's watch stopped (it would restart llama-server as soon as the worker went away), and the cluster
    put back afterwards: the worker's RPC server started, llama-server restarted onto it, the watch started."""
    builder, node = connect("builder"), connect("node")
    builder.check_output("systemctl stop llama-server-watch.service")
    yield builder, node
    node.run("systemctl stop rpc-impostor.service; systemctl reset-failed rpc-impostor.service")
    node.check_output("systemctl start llama-rpc-server.service")
    builder.check_output("systemctl restart llama-server.service")
    builder.check_output("systemctl start llama-server-watch.service")
    wait_health(builder, SERVER_PORT, timeout=300)


def test_a_master_started_without_its_worker_refuses_to_serve(without_the_watch):
    """Trees of RPC protocol <= 5.1 start llama-server without a worker they cannot reach and would serve on fewer
    devices, silently (LLAMACPP.md). The unit's --device list, the plan's devices, makes even this tree refuse
    instead: llama-server exits naming the device, systemd starts it again, its wait names the worker; status.yml
    and verify.yml fail naming the master's unit and the worker's."""
    builder, node = without_the_watch
    worker = f"{address(node)}:{RPC_PORT}"
    node.check_output("systemctl stop llama-rpc-server.service")
    node.check_output(f"systemd-run --unit=rpc-impostor python3 -c {shlex.quote(IMPOSTOR)} {address(node)} {RPC_PORT}")
    poll("the impostor listening", lambda: node.run(f"ss -Hltn 'sport = :{RPC_PORT}'").stdout.strip(), 10)
    builder.check_output("systemctl restart llama-server.service")
    # (Its "Failed to connect to" the worker goes through llama.cpp's asynchronous log, which an exit may cut short.)
    poll("llama-server refusing the missing device", lambda: "invalid device: RPC0" in journal(builder, since="-1min"))
    poll("the wait naming the worker", lambda: f"waiting for worker node ({worker})" in journal(builder, since="-1min"))
    status, verify = status_and_verify()
    assert re.search(r"builder: llama-server\.service is \w+, not active", status), status[-4000:]
    assert "node: llama-rpc-server.service is inactive, not active" in status, status[-4000:]
    assert re.search(r"builder: llama-server\.service is \w+, not active", verify), verify[-4000:]


def test_a_master_that_lost_its_worker_is_named_on_fewer_devices(without_the_watch):
    """A worker gone while llama-server runs idle (its connection closed by the worker, which llama-server notices
    only at its next request; the watch, stopped here, would restart it): status.yml and verify.yml name the worker
    the master serves without."""
    builder, node = without_the_watch
    worker = f"{address(node)}:{RPC_PORT}"
    wait_health(builder, SERVER_PORT, timeout=300)
    node.check_output("systemctl stop llama-rpc-server.service")
    poll("the master's connection to the worker closed", lambda: worker not in builder.check_output(
        "ss -Htn state established"), 30)
    status, verify = status_and_verify()
    assert re.search(rf"builder: llama-server serves without node \({re.escape(worker)}\): no connection, so on "
                     rf"fewer devices than planned \(0 of the 1 RPC workers of its plan\) \(fix: start the missing "
                     rf"RPC servers", status), status[-4000:]
    assert re.search(rf"builder: llama-server serves without {re.escape(worker)}: no connection, so on fewer devices "
                     rf"than planned", verify), verify[-4000:]
