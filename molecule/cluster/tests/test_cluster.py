"""The deployed cluster serves completions with its layers really spread over the workers."""

import json
import os
import re
from pathlib import Path

import pytest
from cluster_helpers import (RPC_PORT, SERVER_PORT, WORKERS, address, cmdline, http_json, journal, main_pid, option,
                             placement, rpc_server_pid, single_process_completion, wait_health)
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils.llama_gguf import read_model_info
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_split import llamacpp_layer_assignment

MODEL_ON_CONTROLLER = Path(os.environ["LLAMA_CACHE_DIR"]) / "models" / "cluster.gguf"
SINGLE_PORT = 18181
PROMPT = {"prompt": "Once upon a time", "n_predict": 32, "temperature": 0, "seed": 1234,
          # Re-evaluating a cached prompt token shifts the numbers slightly; random weights make
          # near-ties, so compare fresh evaluations only.
          "cache_prompt": False}


@pytest.fixture(scope="module")
def server_args(master):
    return cmdline(master, main_pid(master, "llama-server.service"))


def test_units_active_and_enabled(master, workers):
    assert master.service("llama-server.service").is_running
    assert master.service("llama-server.service").is_enabled
    for worker in workers.values():
        assert worker.service("llama-rpc-server.service").is_running
        assert worker.service("llama-rpc-server.service").is_enabled


def test_services_run_as_llama(master, workers):
    assert master.process.get(pid=main_pid(master, "llama-server.service")).user == "llama"
    for worker in workers.values():
        assert worker.process.get(pid=main_pid(worker, "llama-rpc-server.service")).user == "llama"


def test_worker_listens_on_its_cluster_address_only(master, workers):
    for worker in workers.values():
        ip = address(worker)
        # Local address column of every listening socket on the port: only the cluster address.
        local = [line.split()[3] for line in worker.check_output(f"ss -Hltn sport = :{RPC_PORT}").splitlines()]
        assert local == [f"{ip}:{RPC_PORT}"]
        # Nothing answers on loopback (refused: nothing is queued on the real socket).
        assert worker.run(f"timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{RPC_PORT}'").rc != 0
        # The master reached the cluster address: llama-server's unit holds a connection to it.
        connections = master.check_output(f"ss -Htne state established dst {ip}:{RPC_PORT}")
        assert "/llama-server.service" in connections, connections


def test_readiness_checks_leave_no_connection_queued(workers):
    """An RPC server serves one client at a time with a listen backlog of 1: a probe that connects while the
    master is served waits in the accept queue for good, and after two such probes the port takes no more
    connections. The converge and idempotence runs must leave that queue empty (Recv-Q 0)."""
    for name, worker in workers.items():
        listening = worker.check_output(f"ss -Hltn sport = :{RPC_PORT}").split()
        assert listening[1] == "0", f"{name}: {listening[1]} connection(s) queued on the RPC port: {listening}"


def test_master_command_line_names_rpc_device_and_split(server_args, workers):
    endpoints = [f"{address(workers[name])}:{RPC_PORT}" for name in WORKERS]
    assert option(server_args, "--rpc") == ",".join(endpoints)
    assert server_args.index("--rpc") < server_args.index("--device")
    devices = option(server_args, "--device").split(",")
    split = [int(value) for value in option(server_args, "--tensor-split").split(",")]
    assert devices == ["RPC0", "RPC1"]
    assert len(split) == len(devices) and all(value > 0 for value in split)
    n_layer = read_model_info(str(MODEL_ON_CONTROLLER))["n_layer"]
    assert int(option(server_args, "-ngl")) == n_layer + 1
    assert sum(split) == n_layer + 1
    assert option(server_args, "-c") == "2048"


def test_binaries_report_the_pinned_commit(master, workers):
    commit = os.environ["LLAMA_SRC_0_3_36_COMMIT"]
    for host in (master, *workers.values()):
        info = json.loads(host.file("/opt/llama.cpp/current/BUILD-INFO.json").content_string)
        assert info["commit"] == commit
        assert info["rpc_proto"] == "7.0.0"
        assert info["rpc_server_binary"] == "ggml-rpc-server"
        assert info["no_mmap_args"] == ["--load-mode", "none"]
        # A directory per build, named by it (commit, backend, platform, flags hash).
        assert host.file("/opt/llama.cpp/current").linked_to == f"/opt/llama.cpp/{info['build_id']}"
        assert info["build_id"].startswith(f"llama.cpp-{commit[:12]}-cpu-")
        for binary in ("llama-server", "llama-cli", "llama-bench"):
            version = host.run(f"/opt/llama.cpp/current/bin/{binary} --version")
            assert f"commit {commit}" in version.stdout + version.stderr, binary


def test_cluster_completion_equals_single_process(master, server_args):
    wait_health(master, SERVER_PORT)
    cluster = http_json(master, SERVER_PORT, "/completion", PROMPT)
    assert cluster["tokens_predicted"] == 32
    alone = single_process_completion(master, option(server_args, "-m"), PROMPT, SINGLE_PORT)
    assert alone["tokens_predicted"] == 32
    assert cluster["content"] == alone["content"]


def _rss_kib(host, pid):
    status = host.file(f"/proc/{pid}/status").content_string
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))


def test_each_worker_holds_its_layers(master, workers, server_args):
    """A worker's RPC server holds the weights of its planned layers: its resident memory exceeds an
    idle RPC server's by most of their size (the CPU device keeps tensors in host memory)."""
    info = read_model_info(str(MODEL_ON_CONTROLLER))
    split = [int(value) for value in option(server_args, "--tensor-split").split(",")]
    assignment = llamacpp_layer_assignment(info["n_layer"], info["n_layer"] + 1, split)
    weights = info["layer_bytes"] + [info["output_bytes"]]
    for index, name in enumerate(WORKERS):
        worker = workers[name]
        expected = sum(size for layer, size in enumerate(weights) if assignment[layer] == index)
        idle_server = "/opt/llama.cpp/current/bin/ggml-rpc-server -H 127.0.0.1 -p 50999"
        idle = worker.run(f"runuser -u llama -- timeout 20 {idle_server} >/dev/null 2>&1 &")
        assert idle.rc == 0
        listening = "for i in $(seq 200); do ss -Hltn 'sport = :50999' | grep -q . && exit 0; sleep 0.1; done; exit 1"
        assert worker.run(listening).rc == 0, "the idle RPC server did not listen within 20 s"
        # The server process itself (not runuser or timeout): its command line is exactly this.
        idle_pid = int(worker.check_output(f"pgrep -fx '{idle_server}'"))
        baseline = _rss_kib(worker, idle_pid)
        worker.run(f"kill {idle_pid}")
        serving = _rss_kib(worker, rpc_server_pid(worker))
        assert (serving - baseline) * 1024 >= 0.8 * expected, (
            f"{name}: RSS {serving} KiB vs idle {baseline} KiB; expected about {expected / 1024:.0f} KiB of weights")


def test_llama_cpp_compiled_once_per_build_group(master, workers):
    ledger = Path(os.environ["LLAMA_ARTIFACT_CACHE"]) / "builds.log"
    build_ids = {json.loads(host.file("/opt/llama.cpp/current/BUILD-INFO.json").content_string)["build_id"]
                 for host in (master, *workers.values())}
    assert len(build_ids) == 1, "the three CPU nodes form one build group"
    compilations = [line for line in ledger.read_text().splitlines() if line.split()[1] in build_ids]
    # The verify step runs after converge and the idempotence converge: one compilation in all.
    assert len(compilations) == len(build_ids), compilations


def test_llama_cpp_placement_matches_the_plan(master):
    """The layers llama.cpp actually put on each device (its load log) are the printed plan's."""
    planned, actual, _ = placement(master)
    assert actual == planned
    assert len(set(planned.values())) == 2 and sorted(planned) == list(range(len(planned)))


def test_every_master_session_gets_fresh_rpc_servers(master, workers):
    """llama_rpc_fresh_per_session: when llama-server restarts, every worker replaces the RPC server process that
    served it (its session guard, the unit's main process, stays), and the new llama-server waits until each worker
    answers the RPC handshake. A process that served one master never serves another: with the Vulkan backend on
    lavapipe, a second session corrupts its heap (the vulkan scenario reproduces it)."""
    unit = "llama-rpc-server.service"
    before = {name: (main_pid(host, unit), rpc_server_pid(host)) for name, host in workers.items()}
    since = master.check_output("date '+%Y-%m-%d %H:%M:%S'")
    master.check_output("systemctl restart llama-server.service")
    wait_health(master, SERVER_PORT)
    answer = http_json(master, SERVER_PORT, "/completion", {"prompt": "Hello", "n_predict": 4, "temperature": 0})
    assert answer["tokens_predicted"] == 4
    for name, host in workers.items():
        guard, server = main_pid(host, unit), rpc_server_pid(host)
        assert guard == before[name][0] and server != before[name][1], (name, before[name], (guard, server))
        assert host.process.get(pid=server).user == "llama"
        log = journal(host, unit, since)
        assert re.search(r"llama-rpc-session: a master session ended after [0-9.]+ s: replacing the RPC server", log), log
    waited = journal(master, "llama-server.service", since)
    for name in workers:
        assert re.search(rf"llama-wait-workers: worker {name} \(\S+\) answers \(RPC protocol 7\.0\.0\)", waited), waited
