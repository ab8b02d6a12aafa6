#!/usr/bin/env python3
"""make bench / tools/bench.py -i INVENTORY: the cluster's speed claims, each a ratio measured in one run against its
natural reference, written to bench/<date>-<commit>.{json,md} with plots, and appended to bench/history.jsonl
(tools/bench_report.py computes and draws). Every playbook it runs is timed with Ansible's profile_tasks callback: the
record keeps each run's slowest tasks, where the time goes.

With --fresh (the demo only: tools/demo-containers.yml makes its containers again), in this order:
  P1, P2b, UP  fresh hosts, an empty artifact cache and a compiler cache on the builder: a fresh site.yml (it
      compiles) ÷ a bare cmake configure + build of the same tree and flags on the builder, without the compiler
      cache (P1); then upgrade.yml to a changed flag (llamacpp_native) while clients ask the API: its compilation
      ÷ the first compilation of the tree, both from the build ledger (P2b); then upgrade.yml back to the first
      build while clients ask the API (no compilation). UP: the outage ÷ llama-server's model load, both as each of
      the two upgrades reports them (the clients' longest wait and failures are recorded beside it).
  P9  site.yml on fresh hosts with 3, 6 and 12 workers (the build from the artifact cache): the least-squares slope
      of converge seconds against workers; no compilation.
  P3  a no-op site.yml ÷ a fresh site.yml on fresh hosts (the build from the artifact cache); the no-op run must
      report changed=0. This leaves the demo as make demo makes it, so it runs after the others above.
On a cluster of its own (tools/bench_large.py, made and removed for them; see there):
  L1-L5, M1  a 4.3 GiB model over links shaped to 200 Mbit/s: cold ÷ warm load, a pre-filled switch's outage ÷ a
      warm load and the bytes crossing inside it, upgrade.yml's outage, the clients' failures, the master's memory.
On the running cluster (any inventory):
  P5  decode tok/s through the cluster's API ÷ the same llama-server binary, arguments and workers started by hand
      (a transient unit, without the project's unit, front or watch), on the master, requests from the master.
  P6  tok/s with llama_split_strategy speed ÷ memory, the first two workers' RPC servers given CPU quotas 2:1
      (60 % and 30 % per few ms: systemctl set-property --runtime CPUQuota=, removed after), speeds calibrated by
      playbooks/calibrate.yml.
  C1  32 concurrent clients through the API for 60 s, more than llama-server's slots (each sends a 4-token completion
      as soon as its last one is answered): failed requests ÷ requests sent, with the latencies beside.
  R1  8 clients asking back to back through the front, for 20 s each way: requests/s with a replica of the model
      (llama_instances: `bench`, its llama-server on the master over every worker, its own RPC servers beside
      theirs) ÷ the cluster's own alone (the replica drained at the front); site.yml adds the replica, and removes it
      after.

The cluster is exclusive while it runs: it is stopped, re-planned and restarted; P5 and P6 leave it as they found it.
Usage: tools/bench.py [-i inventory/demo] [--figures P1,P2b,...] [--repeat 3] [--fresh] [--out bench]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import tempfile

import testinfra

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "molecule" / "shared"))
import bench_report  # noqa: E402  # pylint: disable=wrong-import-position
from cluster_helpers import (  # noqa: E402  # pylint: disable=wrong-import-position
    ApiClients, cmdline, main_pid, option, recap, replica_rates, run_playbook, wait_health)

MEASURED = ("P1", "P2b", "UP", "P9", "P3", "P5", "P6", "C1", "R1", "L1", "L2", "L3", "L4", "L5", "M1")
C1_CLIENTS, C1_SECONDS = 32, 60
# R1: clients asking back to back, and the seconds measured with two replicas, then with one.
R1_CLIENTS, R1_SECONDS = 8, 20
# Large models over a shaped link: a cluster of their own (tools/bench_large.py), made and removed for them.
LARGE = ("L1", "L2", "L3", "L4", "L5", "M1")
FRESH = ("P1", "P2b", "UP", "P9", "P3")
DEMO = ROOT / "inventory" / "demo"
P9_WORKERS = (3, 6, 12)
# The first two workers' CPU quotas for P6, over periods of a few ms (CPUQuotaPeriodSec=1ms; systemd keeps the quota
# at 1 ms or more): a worker computes its layers of a token in some ms and waits for the others meanwhile, so over
# systemd's default 100 ms period its quota never bound (100 % against 50 %, or 30 % against 15 %: the two splits
# within 3 % of each other); within each few ms, it slows every computation, as a slower device does.
P6_QUOTAS = ("60%", "30%")
# The flag P2b changes: GGML_NATIVE recompiles ggml's CPU backend and nothing else.
CHANGED_FLAG = "llamacpp_native=true"
BENCH_CCACHE = "/var/cache/llamacpp-bench-ccache"
# The demo's artifact cache (role llamacpp's default llamacpp_artifact_cache), whose ledger P9 reads.
ARTIFACTS = Path("~/.cache/llamacpp-rpc-cluster/artifacts").expanduser()
LOGS = os.environ.get("LLAMA_BENCH_LOGS", "")  # a directory: every playbook's whole output is kept there
PROFILE = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks", "PROFILE_TASKS_SORT_ORDER": "descending",
           "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "10"}
HAND_PORT = 18190
HAND_UNIT = "llama-bench-by-hand"
# One greedy request of 64 tokens, measured on the master from request to answer; prints [tokens, seconds, decode].
REQUEST = r"""
import json, sys, time, urllib.request
url, key_file = sys.argv[1], sys.argv[2]
headers = {"Content-Type": "application/json"}
if key_file:
    headers["Authorization"] = "Bearer " + open(key_file).read().strip()
body = json.dumps({"prompt": "Once upon a time", "n_predict": 64, "temperature": 0, "seed": 1234,
                   "cache_prompt": False, "ignore_eos": True}).encode()
start = time.monotonic()
with urllib.request.urlopen(urllib.request.Request(url + "/completion", body, headers), timeout=600) as response:
    answer = json.load(response)
print(json.dumps([answer["tokens_predicted"], time.monotonic() - start, answer["timings"]["predicted_per_second"]]))
"""
def host(inventory, name):
    """A testinfra host for an inventory host. The demo's are containers reached through Docker, which testinfra's
    ansible backend does not do: Ansible says which container."""
    message = "{{ ansible_connection | default('ssh') }} {{ ansible_host | default(inventory_hostname) }}"
    shown = subprocess.run(["ansible", name, "-i", inventory, "-o", "-m", "ansible.builtin.debug", "-a",
                            json.dumps({"msg": message})], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    connection, address = json.loads(shown.split("=>", 1)[1])["msg"].split()
    if connection.endswith("docker"):
        return testinfra.get_host(f"docker://{address}")
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}")


def python(node, script, *args):
    return node.check_output(f"python3 -c {shlex.quote(script)} " + " ".join(shlex.quote(str(arg)) for arg in args))


def slowest_tasks(output, count=8):
    """profile_tasks' summary (sorted, slowest first): [[task, seconds]] of the first `count`."""
    rows = re.findall(r"^(\S.*?) -{3,} ([\d.]+)s$", output, re.M)
    return [[task.strip(), float(seconds)] for task, seconds in rows[:count]]


def controller_cpu():
    """CPU seconds of this process's finished children: ansible-playbook, its forks and their connections' clients
    (docker exec, ssh), not the hosts' own work."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_playbook(inventory, playbook, *args, timeout=7200):
    """(seconds, output, profile) of one ansible-playbook run, which must succeed; profile: its slowest tasks and the
    controller's CPU seconds."""
    began, cpu = time.monotonic(), controller_cpu()
    result = run_playbook(playbook, *args, inventory=inventory, timeout=timeout, env=PROFILE)
    seconds, cpu = time.monotonic() - began, controller_cpu() - cpu
    output = result.stdout + result.stderr
    if LOGS:
        Path(LOGS).mkdir(parents=True, exist_ok=True)
        log = Path(LOGS) / f"{time.strftime('%H%M%S')}-{Path(playbook).stem}.log"
        log.write_text(" ".join(args) + "\n" + output)
    if result.returncode != 0:
        sys.exit(f"{playbook} {' '.join(args)} failed:\n{output[-4000:]}")
    return seconds, output, {"controller_cpu_s": round(cpu, 1), "slowest": slowest_tasks(output)}


def profiled(name, seconds, profile):
    return {"run": name, "seconds": round(seconds, 1), **profile}


def demo_containers(state, workers=2):
    """Remove the demo's containers (every one of its label), or start them afresh with `workers` workers."""
    subprocess.run(["ansible-playbook", "tools/demo-containers.yml", "-e", "demo_state=absent"], cwd=ROOT,
                   check=True, capture_output=True)
    if state == "present":
        subprocess.run(["ansible-playbook", "tools/demo-containers.yml", "-e", f"demo_workers={workers}"],
                       cwd=ROOT, check=True, capture_output=True)


def scaled_inventory(directory, workers):
    """The demo's inventory with `workers` workers (llama-demo-worker1..N), its group_vars shared."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["all:", "  children:", "    llama_master:", "      hosts:", "        master:",
             "          ansible_host: llama-demo-master", "    llama_workers:", "      hosts:"] + [
             line for index in range(1, workers + 1)
             for line in (f"        worker{index}:", f"          ansible_host: llama-demo-worker{index}")] + [
             "  vars:", "    ansible_connection: community.docker.docker"]
    (directory / "hosts.yml").write_text("\n".join(lines) + "\n")
    if not (directory / "group_vars").exists():
        (directory / "group_vars").symlink_to(DEMO / "group_vars")
    return str(directory)


def ledger(cache):
    """The build ledger's compilations: [(build id, host, seconds, rest of the line)]."""
    path = Path(cache) / "builds.log"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        found = re.match(r"\S+ (\S+) compiled on (\S+) in (\d+):(\d+):([\d.]+)(.*)", line)
        if found:
            build, node, hours, minutes, seconds, rest = found.groups()
            rows.append((build, node, int(hours) * 3600 + int(minutes) * 60 + float(seconds), rest.strip(", ")))
    return rows


def bare_build(node, build_root, info):
    """Seconds of a cmake configure + build of the active build's tree and flags on `node`, by hand: another build
    directory, no compiler cache, the same targets and parallelism. The tree is the one the role compiled last
    (roles/llamacpp: one source path for every commit), which is the active build's right after its compilation."""
    source = f"{build_root}/src"
    bare = "/var/tmp/llama-bench-bare"
    targets = " ".join(shlex.quote(target) for target in info["binaries"])
    args = " ".join(shlex.quote(arg) for arg in info["cmake_args"])
    script = (f"rm -rf {bare}; {{ cmake -S {source} -B {bare} {args} && cmake --build {bare} --parallel $(nproc) "
              f"--target {targets}; }} > {bare}.log 2>&1 || {{ tail -n 40 {bare}.log; exit 1; }}; "
              f"rm -rf {bare} {bare}.log")
    began = time.monotonic()
    result = node.run(f"env -u CCACHE_DIR bash -c {shlex.quote(script)}")
    seconds = time.monotonic() - began
    if result.rc != 0:
        sys.exit(f"the bare build on {node.backend.hostname} failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    return seconds


def switch_report(output):
    """(outage, model load) in seconds, as upgrade.yml reports them: first node stopped -> /health 200, and
    llama-server started -> /health 200."""
    found = re.search(r"Outage \(first node stopped -> /health 200\): ([\d.]+) s, of which the model load "
                      r"\(llama-server started -> /health 200\) ([\d.]+) s", " ".join(output.split()))
    if not found:
        sys.exit(f"UP: upgrade.yml did not report its outage:\n{output[-3000:]}")
    return tuple(map(float, found.groups()))


def measure_build(inventory, facts_of):
    """P1, P2b and UP from one sequence on fresh hosts: an empty artifact cache, a compiler cache on the builder."""
    demo_containers("present")
    cache = tempfile.mkdtemp(prefix="llama-bench-artifacts-")
    extra = ["-e", f"llamacpp_artifact_cache={cache}", "-e", f"llamacpp_ccache_dir={BENCH_CCACHE}"]
    converge, output, converge_profile = timed_playbook(inventory, "site.yml", *extra)
    nodes = len([name for name in recap(output) if name != "localhost"])
    [(first_id, builder, first_compile, first_cache)] = ledger(cache)
    facts = facts_of(inventory)
    node = host(inventory, builder)
    info = json.loads(node.check_output("cat /opt/llama.cpp/current/BUILD-INFO.json"))
    bare = [bare_build(node, facts["build_root"], info)]  # minutes of both cores, and steady: once
    p1 = bench_report.figure("P1", [converge], bare, profile=[profiled("fresh site.yml", converge, converge_profile)],
                             notes=[f"the converge compiled once, on {builder}, in {first_compile:.0f} s "
                                    f"({first_cache or 'no compiler cache'}), and installed {nodes} hosts; the bare "
                                    "build is configure + build of the same tree, flags and targets, without ccache"])
    upgrade, output, upgrade_profile = timed_playbook(inventory, "upgrade.yml", *extra, "-e", CHANGED_FLAG)
    switches = [switch_report(output)]
    second = [row for row in ledger(cache) if row[0] != first_id]
    if len(second) != 1:
        sys.exit(f"P2b: the upgrade to {CHANGED_FLAG} compiled {len(second)} times: {second}")
    [(_, _, second_compile, second_cache)] = second
    p2b = bench_report.figure("P2b", [second_compile], [first_compile],
                              profile=[profiled("upgrade.yml", upgrade, upgrade_profile)],
                              notes=[f"upgrade.yml to {CHANGED_FLAG} (GGML_NATIVE: ggml's CPU backend changes): "
                                     f"{second_cache or 'no compiler cache'}"])
    # Back to the first build, which every node keeps (the rollback point): the switch alone, clients asking.
    master = host(inventory, facts["master"])
    with ApiClients(master, port=api_port(facts), key=api_key(master, facts)) as clients:
        clients.event("upgrade.yml")
        back, output, back_profile = timed_playbook(inventory, "upgrade.yml", *extra)
        time.sleep(3)
    if len(ledger(cache)) != 2:
        sys.exit(f"UP: the upgrade back to {first_id} compiled: {ledger(cache)}")
    switches.append(switch_report(output))
    waits = [request[1] for requests in clients.results.values() for request in requests]
    failed = sum(len(requests) for requests in clients.failed().values())
    up = bench_report.figure("UP", [outage for outage, _ in switches], [load for _, load in switches],
                             failed=failed, requests=len(waits), longest_wait=max(waits),
                             profile=[profiled("upgrade.yml back", back, back_profile)],
                             notes=[f"the outage and the model load as upgrade.yml reports them, of the upgrade to "
                                    f"{CHANGED_FLAG} and the one back to the first build (kept on every node: no "
                                    f"compilation); during the latter, {len(waits)} requests (1 client every 0.5 s, "
                                    f"8 every 2 s), {failed} failed, the longest waited {max(waits):.1f} s (the "
                                    "requests held through the outage are then served one after the other)"])
    return {"P1": p1, "P2b": p2b, "UP": up}


def measure_p9():
    """Fresh converges with 3, 6 and 12 workers, the build from the artifact cache: no compilation."""
    points, cpu, profiles = [], [], []
    with tempfile.TemporaryDirectory(prefix="llama-bench-p9-") as directory:
        for workers in P9_WORKERS:
            demo_containers("present", workers)
            compiled = len(ledger(ARTIFACTS))
            inventory = scaled_inventory(Path(directory) / str(workers), workers)
            seconds, _, profile = timed_playbook(inventory, "site.yml")
            if len(ledger(ARTIFACTS)) != compiled:
                sys.exit(f"P9: the converge of {workers} workers compiled")
            points.append((workers, round(seconds, 1)))
            cpu.append((workers, profile["controller_cpu_s"]))
            profiles.append(profiled(f"fresh site.yml, {workers} workers", seconds, profile))
            print(f"P9: {workers} workers converged in {seconds:.0f} s", flush=True)
    per_worker = bench_report.slope(cpu)[0]
    return bench_report.slope_figure("P9", points, compiles=0, profile=profiles, controller_cpu=cpu, notes=[
        f"the controller's CPU per added worker: {per_worker:.1f} s (ansible-playbook, its forks and docker exec: "
        "what a cluster of separate machines serializes; the rest of the slope is the hosts' own work, here on the "
        "same 2 cores)"])


def measure_p3(inventory):
    """One fresh converge (the demo's containers made again) and the no-op run after it: the demo as make demo
    leaves it."""
    demo_containers("present")
    converge, _, converge_profile = timed_playbook(inventory, "site.yml")
    rerun, output, rerun_profile = timed_playbook(inventory, "site.yml")
    changed = {name: stats["changed"] for name, stats in recap(output).items() if stats["changed"]}
    if changed:
        sys.exit(f"P3: the second site.yml changed something: {changed}")
    return bench_report.figure("P3", [rerun], [converge], profile=[
        profiled("fresh site.yml", converge, converge_profile), profiled("no-op site.yml", rerun, rerun_profile)])


def server_argv(master, unit):
    """llama-server's argv and environment as its unit runs it (from /proc of its main process)."""
    pid = main_pid(master, unit)
    environ = master.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
    keep = [line for line in environ if re.match(r"(LLAMA_|GGML_|CUDA_|HIP_|ROCR_|LD_LIBRARY_PATH)", line)]
    return cmdline(master, pid), keep


def api_port(facts):
    return int(re.search(r":(\d+)/?$", facts["url"]).group(1))


def key_file(master, facts):
    """The file llama-server reads its API key from (--api-key-file), "" without one."""
    return option(server_argv(master, facts["units"]["server"])[0], "--api-key-file", "")


def api_key(master, facts):
    """The API key llama-server reads, "" without one."""
    path = key_file(master, facts)
    return master.check_output(f"cat {shlex.quote(path)}").strip() if path else ""


def requests(master, url, key_path, repeat):
    python(master, REQUEST, url, key_path)  # warm-up
    samples = [json.loads(python(master, REQUEST, url, key_path)) for _ in range(repeat)]
    return [tokens / seconds for tokens, seconds, _ in samples], [decode for _, _, decode in samples]


def measure_p5(inventory, facts, repeat):
    master = host(inventory, facts["master"])
    units = facts["units"]
    argv, environ = server_argv(master, units["server"])
    key_path = option(argv, "--api-key-file", "")
    cluster_port = api_port(facts)
    cluster, cluster_decode = requests(master, facts["url"], key_path, repeat)
    hand_argv = list(argv)
    for flag, value in (("--port", str(HAND_PORT)), ("--host", "127.0.0.1")):
        if flag in hand_argv:
            hand_argv[hand_argv.index(flag) + 1] = value
        else:
            hand_argv += [flag, value]
    settings = " ".join(f"--setenv={shlex.quote(line)}" for line in environ)
    master.check_output(f"systemctl stop {units['watch']} {units['server']}")
    try:
        # A worker's RPC server takes a moment to serve its next client after llama-server's session ended: started
        # before, llama-server aborts ("Remote RPC server crashed"), and is started again, as one would by hand.
        master.check_output(f"systemd-run --quiet --collect --unit={HAND_UNIT} -p User=llama -p Restart=on-failure "
                            f"-p RestartSec=1 {settings} " + " ".join(shlex.quote(arg) for arg in hand_argv))
        wait_health(master, HAND_PORT, timeout=300)
        hand, hand_decode = requests(master, f"http://127.0.0.1:{HAND_PORT}", key_path, repeat)
    finally:
        master.run(f"systemctl stop {HAND_UNIT}.service")
        master.check_output(f"systemctl start {units['server']} {units['watch']}")
        wait_health(master, cluster_port, timeout=600)
    return bench_report.figure(
        "P5", cluster, hand, decode_tps={"cluster": cluster_decode, "by hand": hand_decode},
        notes=[f"end-to-end tok/s of 64-token greedy requests from the master (llama-server's own decode tok/s: "
               f"cluster {bench_report.median(cluster_decode):.1f}, by hand {bench_report.median(hand_decode):.1f})"])


def split_line(output):
    return next((line.strip().strip('",') for line in output.splitlines() if "--tensor-split" in line
                 and "strategy" in line), "")


def measure_p6(inventory, facts, repeat):
    """Two workers' RPC servers held to CPU quotas 2:1; tok/s with the memory split (the cluster as it is planned
    by default) and with the speed split from playbooks/calibrate.yml's calibration under the same quotas."""
    master = host(inventory, facts["master"])
    key_path = key_file(master, facts)
    quotas = dict(zip(list(facts["rpc_units"])[:2], P6_QUOTAS))
    if len(quotas) < 2:
        return bench_report.skipped("P6", "needs two workers")
    nodes = {name: host(inventory, name) for name in quotas}
    speeds = Path(tempfile.mkdtemp(prefix="llama-bench-speeds-")) / "llama-speeds.json"
    profiles, plans = [], {}
    try:
        for name, quota in quotas.items():
            nodes[name].check_output(f"systemctl set-property --runtime {facts['rpc_units'][name]} CPUQuota={quota} "
                                     "CPUQuotaPeriodSec=1ms")
        samples = {}
        for strategy in ("memory", "speed"):
            if strategy == "speed":
                seconds, _, profile = timed_playbook(inventory, "playbooks/calibrate.yml", "-e",
                                                     f"llama_speeds_file={speeds}")
                profiles.append(profiled("playbooks/calibrate.yml", seconds, profile))
            seconds, output, profile = timed_playbook(inventory, "site.yml", "-e", f"llama_speeds_file={speeds}",
                                                      "-e", f"llama_split_strategy={strategy}")
            profiles.append(profiled(f"site.yml, strategy {strategy}", seconds, profile))
            plans[strategy] = split_line(output)
            wait_health(master, api_port(facts), timeout=600)
            samples[strategy], _ = requests(master, facts["url"], key_path, repeat)
    finally:
        for name in quotas:
            nodes[name].run(f"systemctl set-property --runtime {facts['rpc_units'][name]} CPUQuota= CPUQuotaPeriodSec=")
        timed_playbook(inventory, "site.yml")
    recorded = json.loads(speeds.read_text()) if speeds.exists() else {}
    measured = {name: recorded.get(name, {}) for name in quotas}
    return bench_report.figure("P6", samples["speed"], samples["memory"], profile=profiles, plans=plans,
                               notes=[f"CPU quotas {', '.join(f'{name} {quota}' for name, quota in quotas.items())}; "
                                      f"calibrated speeds {json.dumps(measured)}; plans: {json.dumps(plans)}"])


def measure_c1(inventory, facts):
    """C1: C1_CLIENTS clients asking through the API without a pause, for C1_SECONDS, on the master."""
    master = host(inventory, facts["master"])
    slots = option(server_argv(master, facts["units"]["server"])[0], "--parallel", "1")
    with ApiClients(master, groups=((f"{C1_CLIENTS} clients", C1_CLIENTS, 0.0),), port=api_port(facts),
                    key=api_key(master, facts)) as clients:
        time.sleep(C1_SECONDS)
    group = f"{C1_CLIENTS} clients"
    row = clients.figures(float("-inf"), float("inf"))[group]
    return bench_report.figure(
        "C1", [row["failed"]], [row["requests"]], failures=clients.failed()[group][:10],
        notes=[f"{C1_CLIENTS} clients for {C1_SECONDS} s against {slots} slot(s) (--parallel): {row['requests']} "
               f"requests, latency p50 {row['p50']:.2f} s, p99 {row['p99']:.2f} s, max {row['max']:.2f} s"])


def measure_r1(inventory, facts):
    """R1: R1_CLIENTS clients asking back to back through the front, with a replica of the model (docs/instances.md)
    beside the cluster's own, then with the replica drained: requests/s of each."""
    master = host(inventory, facts["master"])
    replica = {"name": "bench", "model_path": facts["model_path"], "served_name": facts["served_name"],
               "workers": list(facts["rpc_units"])}
    profiles = []
    seconds, _, profile = timed_playbook(inventory, "site.yml", "-e", json.dumps({"llama_instances": [replica]}))
    profiles.append(profiled("site.yml with a replica", seconds, profile))
    try:
        clients, (two, one) = replica_rates(master, "llama_server/bench", R1_SECONDS, clients=R1_CLIENTS,
                                            port=api_port(facts), key=api_key(master, facts))
    finally:
        seconds, _, profile = timed_playbook(inventory, "site.yml")
        profiles.append(profiled("site.yml without it", seconds, profile))
    group = f"{R1_CLIENTS} clients"  # replica_rates' name for them
    requests, failed = clients.results[group], clients.failed()[group]
    return bench_report.figure(
        "R1", [two], [one], profile=profiles, failures=failed[:10],
        notes=[f"{R1_CLIENTS} clients back to back, {R1_SECONDS} s each way: two replicas {two:.2f} requests/s, one "
               f"{one:.2f}; {len(failed)} failed of {len(requests)}"])


def read_facts(inventory):
    """The master's settings from the cluster's facts (tools/bench-facts.yml)."""
    with tempfile.TemporaryDirectory(prefix="llama-bench-facts-") as directory:
        path = Path(directory) / "facts.json"
        result = run_playbook("tools/bench-facts.yml", "-e", f"bench_facts_file={path}", inventory=inventory)
        if result.returncode != 0:
            sys.exit(f"tools/bench-facts.yml failed:\n{(result.stdout + result.stderr)[-4000:]}")
        return json.loads(path.read_text())


def commit():
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip() or "unknown"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--inventory", default=str(DEMO))
    parser.add_argument("--figures", default=",".join(MEASURED), help="comma-separated, of " + ", ".join(MEASURED))
    parser.add_argument("--repeat", type=int, default=3, help="measurements of each side of a ratio")
    parser.add_argument("--fresh", action="store_true",
                        help="make the demo's containers again: P1, P2b, UP, P9 and P3 (the demo inventory only)")
    parser.add_argument("--out", default=str(ROOT / "bench"))
    args = parser.parse_args(argv)
    wanted = [name.strip() for name in args.figures.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in MEASURED]
    if unknown:
        parser.error(f"unknown figures {unknown}: this tool measures {', '.join(MEASURED)}")
    inventory = str(Path(args.inventory).resolve())
    if args.fresh and Path(inventory) != DEMO:
        parser.error("--fresh makes the demo's containers again: it measures the demo inventory only")
    os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    figures = {}
    for spec_id in bench_report.SPECS:
        if spec_id not in wanted:
            figures[spec_id] = bench_report.skipped(spec_id, "not asked for (--figures)")
        elif spec_id in FRESH and not args.fresh:
            figures[spec_id] = bench_report.skipped(spec_id, "needs fresh hosts: --fresh (the demo) makes them")

    def measured(results):
        for spec_id, result in results.items():
            if spec_id in wanted:
                figures[spec_id] = result
                print(f"{spec_id}: {bench_report.shown(result)} ({bench_report.verdict(result)})", flush=True)

    if args.fresh and set(wanted) & {"P1", "P2b", "UP"}:
        measured(measure_build(inventory, read_facts))
    if args.fresh and "P9" in wanted:
        measured({"P9": measure_p9()})
    if args.fresh and set(wanted) & set(FRESH):
        measured({"P3": measure_p3(inventory)})  # the demo as make demo leaves it, whatever ran before
    if set(wanted) & set(LARGE):
        import bench_large  # noqa: E402  # pylint: disable=import-outside-toplevel

        measured(bench_large.measure(args.repeat, switch_report, [name for name in wanted if name in LARGE]))
    if set(wanted) & {"P5", "P6", "C1", "R1"}:
        facts = read_facts(inventory)
        if "C1" in wanted:
            measured({"C1": measure_c1(inventory, facts)})
        if "R1" in wanted:
            measured({"R1": measure_r1(inventory, facts)})
        if "P5" in wanted:
            measured({"P5": measure_p5(inventory, facts, args.repeat)})
        if "P6" in wanted:
            measured({"P6": measure_p6(inventory, facts, args.repeat)})
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rec = bench_report.record(figures, date=now, commit=commit(), inventory=args.inventory, repeat=args.repeat)
    report = bench_report.write(rec, args.out)
    print(bench_report.table(rec))
    print(f"report: {report}")


if __name__ == "__main__":
    main()
