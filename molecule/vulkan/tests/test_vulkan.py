"""A mixed cluster: a CPU worker and a Vulkan worker (lavapipe) offering two devices, built as two build groups,
planned and served as llama.cpp itself names and places the devices."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from cluster_helpers import (PROJECT, SERVER_PORT, address, assert_refused_in_preflight, cmdline, container,
                             http_json, journal_tail, main_pid, option, placement, rpc_server_crashes, run_playbook,
                             service_state, single_process_completion, stop_server_on, wait_health)
from suite_report import figures

SINGLE_PORT = 18181
PROMPT = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0, "seed": 1234,
          "cache_prompt": False}


def build_info(host):
    return json.loads(host.file("/opt/llama.cpp/current/BUILD-INFO.json").content_string)


@pytest.fixture(scope="module")
def server_args(master):
    return cmdline(master, main_pid(master, "llama-server.service"))


def test_two_build_groups_each_compiled_once(master, workers):
    cpu = [build_info(host) for host in (master, workers["worker1"])]
    vulkan = build_info(workers["worker2"])
    assert [info["backend"] for info in cpu] == ["cpu", "cpu"] and cpu[0]["build_id"] == cpu[1]["build_id"]
    assert vulkan["backend"] == "vulkan" and vulkan["build_id"] != cpu[0]["build_id"]
    assert "-DGGML_VULKAN=ON" in vulkan["cmake_args"]
    assert "-DVulkan_INCLUDE_DIR=/opt/vulkan-sdk/include" in vulkan["cmake_args"]
    ledger = (Path(os.environ["LLAMA_ARTIFACT_CACHE"]) / "builds.log").read_text().splitlines()
    for build_id in (cpu[0]["build_id"], vulkan["build_id"]):
        # Over the whole suite: the CPU build is the cluster scenario's when both run.
        assert len([line for line in ledger if line.split()[1] == build_id]) == 1, (build_id, ledger)
    compiled_on = {line.split()[1]: line.split()[4] for line in ledger}
    assert compiled_on[vulkan["build_id"]] == "worker2"


def test_the_vulkan_build_reuses_what_the_cpu_build_compiled():
    """The compiler cache (llamacpp_ccache_dir, shared with the cluster scenario's builder): after the CPU build
    of this commit, the Vulkan build compiles only the Vulkan backend (and its 155 shaders) and what -DGGML_USE_VULKAN
    changes: libllama, common and the server differ from the CPU build only by that definition, which none of
    their sources reads, so the cache answers them."""
    ledger = (Path(os.environ["LLAMA_ARTIFACT_CACHE"]) / "builds.log").read_text().splitlines()
    commit = os.environ["LLAMA_SRC_0_3_36_COMMIT"][:12]
    counts = {line.split()[1].split("-")[2]: re.search(r"ccache answered (\d+) of (\d+) compilations", line)
              for line in ledger if line.split()[1].startswith(f"llama.cpp-{commit}-")}
    if not counts.get("cpu"):
        pytest.skip("the CPU build of this commit was not compiled through the cache in this run (cached artifact)")
    assert counts.get("vulkan"), ledger
    _, cpu_total = map(int, counts["cpu"].groups())
    hits, total = map(int, counts["vulkan"].groups())
    figures("the compiler cache", [f"the CPU build compiled {cpu_total}; the Vulkan build {total}, of which {hits} "
                                   "from the cache"])
    assert hits >= 0.9 * cpu_total, ledger


def test_every_binary_finds_its_libraries(master, workers):
    """ldd on the installed binaries and backends resolves everything, on every host; only the Vulkan build
    links the Vulkan loader."""
    for name, host in {"master": master, **workers}.items():
        out = host.check_output("ldd /opt/llama.cpp/current/bin/* /opt/llama.cpp/current/lib/*.so 2>&1")
        assert "not found" not in out, f"{name}: {out}"
        assert ("libvulkan.so.1 =>" in out) == (name == "worker2"), name


def test_devices_are_named_as_llama_cpp_names_them(master, workers):
    """Preflight's plan: worker2's devices as llama.cpp lists them (Vulkan0 is lavapipe's 2048 MiB), two
    consecutive RPC devices for its two devices, in --rpc order."""
    listed = workers["worker2"].check_output(
        "GGML_VK_VISIBLE_DEVICES=0 /opt/llama.cpp/current/bin/llama-server --list-devices")
    assert re.search(r"^\s+Vulkan0: llvmpipe .*\(2048 MiB,", listed, re.M), listed
    result = run_playbook("playbooks/preflight.yml", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    table = result.stdout
    assert re.search(r"RPC0\s+worker1 \(CPU\)", table) or re.search(r"RPC0\s+worker1\s", table), table[-3000:]
    assert re.search(r"RPC1\s+worker2 \(Vulkan0\)", table), table[-3000:]
    assert re.search(r"RPC2\s+worker2 \(CPU\)", table), table[-3000:]


def test_units_name_the_devices(master, workers, server_args):
    worker2 = workers["worker2"]
    unit = worker2.file("/etc/systemd/system/llama-rpc-server.service").content_string
    assert 'Environment="GGML_VK_VISIBLE_DEVICES=0"' in unit
    rpc_args = cmdline(worker2, main_pid(worker2, "llama-rpc-server.service"))
    assert option(rpc_args, "-d") == "Vulkan0,CPU"
    assert "-d" not in cmdline(workers["worker1"], main_pid(workers["worker1"], "llama-rpc-server.service"))
    endpoints = [f"{address(workers[name])}:50052" for name in ("worker1", "worker2")]
    assert option(server_args, "--rpc") == ",".join(endpoints)
    assert option(server_args, "--device") == "RPC0,RPC1,RPC2"
    assert option(server_args, "--tensor-split") == "11,10,10"
    log = worker2.check_output("journalctl -o cat -u llama-rpc-server.service")
    assert "ggml_vulkan: 0 = llvmpipe" in log


def test_llama_cpp_placement_matches_the_plan(master, workers):
    """The layers llama.cpp put on each device (its load log) are the printed plan's, Vulkan0 included."""
    planned, actual, log = placement(master)
    assert actual == planned
    assert sorted(set(planned.values())) == ["RPC0", "RPC1", "RPC2"]
    # llama.cpp's own account of its devices: worker2's two (Vulkan0: lavapipe's 2048 MiB, then its CPU) are
    # RPC1 and RPC2, consecutive, after worker1's RPC0.
    used = {name: (endpoint, int(free)) for name, endpoint, free in
            re.findall(r"using device (RPC\d) \(([0-9.]+:\d+)\) \(.*?\) - (\d+) MiB free", log)}
    worker1, worker2 = (f"{address(workers[name])}:50052" for name in ("worker1", "worker2"))
    assert [used[name][0] for name in ("RPC0", "RPC1", "RPC2")] == [worker1, worker2, worker2], used
    assert used["RPC1"][1] <= 2048 < used["RPC2"][1], used


def test_distributed_equals_single_process_up_to_near_ties(master, server_args):
    """The mixed cluster answers as one CPU process does, token for token, except where the two backends'
    arithmetic (Vulkan dequantizes Q4_1 and multiplies in floating point, the CPU uses Q8_1 dot products) tips
    a near-tie: at the first token that differs, if any, the cluster's token is among the single process's three
    best, within 0.5 (log-probability) of its choice. Measured: " Paris.\n\nThe" the same, then " answer"
    vs " United" (0.36 apart). The answer itself (" Paris.") is the same."""
    wait_health(master, SERVER_PORT)
    body = dict(PROMPT, n_probs=10)
    cluster = http_json(master, SERVER_PORT, "/completion", body)
    alone = single_process_completion(master, option(server_args, "-m"), body, SINGLE_PORT)
    assert cluster["tokens_predicted"] == alone["tokens_predicted"] == 12
    assert cluster["content"].startswith(" Paris.") and alone["content"].startswith(" Paris.")
    ours, theirs = cluster["completion_probabilities"], alone["completion_probabilities"]
    differ = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a["id"] != b["id"]), None)
    print(f"\ncluster: {cluster['content']!r}\nalone:   {alone['content']!r}\nfirst difference at token {differ}")
    if differ is not None:
        top = {entry["id"]: entry["logprob"] for entry in theirs[differ]["top_logprobs"][:3]}
        gap = top[theirs[differ]["id"]] - top.get(ours[differ]["id"], float("-inf"))
        print(f"single process: {theirs[differ]['token']!r} vs the cluster's {ours[differ]['token']!r}: {gap:.3f}")
        assert differ >= 4 and gap <= 0.5, (differ, gap, theirs[differ])


def test_vulkan_headers_too_old_are_refused_in_preflight(master, workers):
    """Without an SDK, Debian 12's libvulkan-dev (1.3.239) cannot build this tree: refused before any change."""
    result = run_playbook("site.yml", "-e", json.dumps({"llamacpp_vulkan_sdk": ""}), timeout=600)
    assert_refused_in_preflight(
        result, r"worker2 builds the Vulkan backend, but the distribution offers libvulkan-dev 1\.3\.239: "
                r"llama\.cpp's Vulkan backend needs Vulkan headers 1\.3\.261 or later .*llamacpp_vulkan_sdk")


def test_a_device_the_worker_does_not_offer_is_refused(master, workers):
    result = run_playbook("site.yml", "-l", "all", "-e", json.dumps({"llama_rpc_devices": ["Vulkan1"]}),
                          timeout=600)
    assert_refused_in_preflight(
        result, r"worker\d: llama_rpc_devices names Vulkan1, but worker\d offers .*\(llama_devices or discovery: ")


def test_the_vulkan_device_through_rpc_equals_one_vulkan_process(master, workers):
    """Every layer on RPC1 (worker2's Vulkan0 through RPC) answers exactly as one llama-server process on
    worker2's Vulkan0 does: RPC adds nothing to the device's arithmetic."""
    worker2 = workers["worker2"]
    model = Path(os.environ["LLAMA_MODEL_SMOLLM2"])
    copied = subprocess.run(["docker", "cp", "-L", str(model), "molecule-vulkan-worker2:/tmp/model.gguf"],
                            capture_output=True, text=True)
    assert copied.returncode == 0, copied.stderr
    split = json.dumps({"llama_tensor_split": [0, 31, 0]})
    try:
        result = run_playbook("site.yml", "--tags", "master,smoke", "-e", split, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:]
        args = cmdline(master, main_pid(master, "llama-server.service"))
        assert option(args, "--device") == "RPC1"
        wait_health(master, SERVER_PORT)
        cluster = http_json(master, SERVER_PORT, "/completion", PROMPT)
        # Mesa's pipelines as the RPC server compiled them (a copy: root's files in the unit's cache would be
        # unreadable to it). The server may still be writing entries (a file gone before cp reads it): the copy
        # is a head start, the single process starts whatever it got.
        started = worker2.run(
            "cp -a /var/cache/llama-vulkan-shaders /tmp/single-shaders 2>/dev/null; "
            "MESA_SHADER_CACHE_DIR=/tmp/single-shaders "
            "GGML_VK_VISIBLE_DEVICES=0 timeout 300 /opt/llama.cpp/current/bin/llama-server -m /tmp/model.gguf "
            f"-c 1024 -t 1 -ngl 999 --device Vulkan0 --host 127.0.0.1 --port {SINGLE_PORT} > /tmp/single.log 2>&1 &")
        assert started.rc == 0
        try:
            try:
                wait_health(worker2, SINGLE_PORT, timeout=300)
            except AssertionError as error:
                raise AssertionError(f"{error}; its log:\n{worker2.run('tail -n 30 /tmp/single.log').stdout}") from None
            alone = http_json(worker2, SINGLE_PORT, "/completion", PROMPT)
        finally:
            # Gone before the restoring run: two processes on lavapipe at once are not what the cluster runs.
            stop_server_on(worker2, SINGLE_PORT)
        print(f"\nRPC1 alone: {cluster['content']!r}\none Vulkan process: {alone['content']!r}")
        assert cluster["tokens_predicted"] == alone["tokens_predicted"] == 12
        assert cluster["content"] == alone["content"]
    finally:
        restored = run_playbook("site.yml", "--tags", "master,smoke", timeout=600)
        worker2.run("rm -rf /tmp/model.gguf /tmp/single-shaders /tmp/single.log")
    # Seen twice, under the suite's full load: the restoring run's smoke request found the restarted llama-server
    # closing the connection without an answer, its RPC client having read an error (a reset) from a worker. The
    # message's first line (the one pytest's summary shows) says how each service last ended; then the journals.
    assert restored.returncode == 0, "\n".join([
        "restoring run failed; " + "; ".join(f"{name} {unit}: {service_state(host, unit)}" for name, host, unit in (
            ("master", master, "llama-server.service"), ("worker1", workers["worker1"], "llama-rpc-server.service"),
            ("worker2", worker2, "llama-rpc-server.service"))),
        restored.stdout[-3000:],
        "master:", journal_tail(master, ["llama-server.service", "llama-server-watch.service"]),
        *(text for name in ("worker1", "worker2")
          for text in (f"{name}:", journal_tail(workers[name], ["llama-rpc-server.service"])))])
    assert option(cmdline(master, main_pid(master, "llama-server.service")), "--device") == "RPC0,RPC1,RPC2"
    # The new plan's session ran on a fresh RPC server process (llama_rpc_fresh_per_session): on one that had
    # served the RPC1-only plan, lavapipe corrupts the heap (test_one_rpc_server_process_per_session).
    assert not rpc_server_crashes(workers), f"an RPC server crashed (heap corruption?): {rpc_server_crashes(workers)}"


def test_one_rpc_server_process_per_session(workers):
    """The reproduction (tools/rpc_session_repro.py, docs/backends.md), on worker2 with its installed Vulkan build:
    two RPC servers on loopback as the scenario's workers, and masters started one after another with the vulkan
    test's two plans (every layer on Vulkan0, then 11,10,10). Without the session guard a server that served the
    first plan corrupts its heap in the second session (glibc aborts it: "corrupted double-linked list"), with
    llama-rpc-session (the unit's, llama_rpc_fresh_per_session) every session gets a fresh process and none dies."""
    worker2 = workers["worker2"]
    files = {"tools/rpc_session_repro.py": "tools", "roles/llama_rpc/files/llama-rpc-session": "roles/llama_rpc/files",
             "roles/llama_server/files/llama-wait-workers": "roles/llama_server/files"}
    worker2.check_output("mkdir -p " + " ".join(f"/tmp/repro/{folder}" for folder in files.values()))
    model = Path(os.environ["LLAMA_MODEL_SMOLLM2"])
    for source, target in [(model, "/tmp/model.gguf")] + [(PROJECT / name, f"/tmp/repro/{name}") for name in files]:
        copied = subprocess.run(["docker", "cp", "-L", str(source), f"{container('worker2')}:{target}"],
                                capture_output=True, text=True)
        assert copied.returncode == 0, copied.stderr
    repro = ("timeout 900 python3 /tmp/repro/tools/rpc_session_repro.py --bin-dir /opt/llama.cpp/current/bin "
             "--model /tmp/model.gguf --json --tail 4")
    try:
        bare = worker2.run(f"{repro} --rounds 6 --stop-at-first-crash")
        guarded = worker2.run(f"{repro} --rounds 6 --supervise")
    finally:
        worker2.run("rm -rf /tmp/repro /tmp/model.gguf /tmp/rpc-session-repro-*")
    print(f"\nwithout the guard:\n{bare.stdout[-2500:]}\nwith llama-rpc-session:\n{guarded.stdout[-1500:]}")
    without, with_guard = (json.loads(run.stdout.strip().splitlines()[-1]) for run in (bare, guarded))
    assert without["crashes"], f"the reproduction did not reproduce in {without['sessions']} sessions: {bare.stdout}"
    assert any(how.startswith("signal") for _, name, how in without["crashes"] if name == "worker2"), without
    assert with_guard["crashes"] == [] and with_guard["failed"] == 0, f"heap corruption with the guard: {guarded.stdout}"


def test_mesa_keeps_the_compiled_pipelines(workers):
    """The Vulkan RPC server's unit gives Mesa a cache it may write (its home is read-only): lavapipe's compiled
    pipelines are kept for the next start (a fresh process per master session) instead of compiled again."""
    worker2 = workers["worker2"]
    environment = worker2.check_output("systemctl show -p Environment --value llama-rpc-server.service")
    assert "MESA_SHADER_CACHE_DIR=/var/cache/llama-vulkan-shaders" in environment.split()
    owners = worker2.check_output("find /var/cache/llama-vulkan-shaders -type f -printf '%u %s\\n'").splitlines()
    assert owners and {line.split()[0] for line in owners} == {"llama"}, owners
    assert sum(int(line.split()[1]) for line in owners) > 100_000, owners


def test_no_rpc_server_crashed(workers):
    """Over the whole scenario (converge, idempotence, every test's restarts), no RPC server of the cluster died:
    a crash is not healed away by Restart=always unnoticed."""
    assert not rpc_server_crashes(workers), rpc_server_crashes(workers)
