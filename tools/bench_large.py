"""make bench's figures of large models over a real link (tools/bench.py --figures L1,L2,L3,L4,L5,M1): a cluster of
its own (llama-large-*: a master and two workers, tools/demo-containers.yml) serving a generated 4.3 GiB model whose
links into the workers are shaped to 200 Mbit/s (molecule/shared/link_bed.py: 4 GiB then take at least 170 s, like
20 GiB over 1 GbE). What crosses each link is counted on this machine's end of it; every load's time comes from
llama-server's own journal (started -> "model loaded").

  L1  the cold first load (site.yml with llama_prefill_enabled false: every weight crosses the links) ÷ a load with warm
      caches (llama-server restarted): what the cache saves.
  L2  the outage of a switch to another 4.3 GiB model, pre-filled while the first serves (llama-server stopped ->
      model loaded) ÷ a load with warm caches.
  L3  the bytes crossing the links inside that outage ÷ the model's size.
  L4  upgrade.yml's outage (llamacpp_native, its own build) on the 4.3 GiB model ÷ a load with warm caches.
  L5  the continuity clients' failed requests ÷ their requests, through the switch and the upgrade.
  M1  llama-server's resident memory at its peak during a warm load, llama_server_mmap auto (the default: no mmap
      while the workers hold layers) ÷ the model's size; the record also holds it with mmap (llama_server_mmap on).
The cluster is removed at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "molecule" / "shared"))
import bench_report  # noqa: E402
import fixtures  # noqa: E402
import link_bed  # noqa: E402
from cluster_helpers import ApiClients, run_playbook  # noqa: E402

NAME = "large"
LINK = "10.241.42"
MBIT = 200
WORKERS = ("worker1", "worker2")
# 4.3 GiB each, f16: every matrix over the RPC cache's 10 MiB threshold (attention 32 MiB, feed-forward 86 MiB).
MODEL_ARGS = ["--n-layer", "10", "--n-embd", "4096", "--n-ff", "11008", "--n-head", "32", "--type", "f16"]
MODELS = {"large": MODEL_ARGS, "large-b": MODEL_ARGS + ["--seed", "1"]}
CHANGED_FLAG = "llamacpp_native=true"
GIB = 2**30

# On the master: every 0.25 s, llama-server's resident memory (all, file-backed: the mapped model, anonymous) and how
# much the machine's page cache grew since the start (the containers share the kernel: the others are idle); the
# peaks, as JSON, when the stop file appears. (Per-cgroup figures are not comparable here: on this host's cgroup v1
# hierarchy the service's memory is charged to the container's group.)
SAMPLER = r"""
import json, os, subprocess, sys, time
stop, out = sys.argv[1], sys.argv[2]
def meminfo(key):
    with open("/proc/meminfo") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith(key + ":"))
cached = meminfo("Cached")
peak = {"rss": 0, "rss_file": 0, "rss_anon": 0, "page_cache_growth": 0}
while not os.path.exists(stop):
    pid = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", "llama-server.service"],
                         capture_output=True, text=True).stdout.strip()
    try:
        with open(f"/proc/{pid}/status") as handle:
            status = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
    except OSError:
        status = {}
    kb = lambda key: int(status.get(key, "0 kB").split()[0]) * 1024
    now = {"rss": kb("VmRSS"), "rss_file": kb("RssFile"), "rss_anon": kb("RssAnon"),
           "page_cache_growth": meminfo("Cached") - cached}
    peak = {key: max(peak[key], value) for key, value in now.items()}
    time.sleep(0.25)
with open(out, "w") as handle:
    json.dump(peak, handle)
"""


def containers(state):
    args = ["-e", f"demo_name={NAME}", "-e", f"demo_link={LINK}"]
    subprocess.run(["ansible-playbook", "tools/demo-containers.yml", "-e", "demo_state=absent", *args], cwd=ROOT,
                   check=True, capture_output=True)
    if state == "present":
        subprocess.run(["ansible-playbook", "tools/demo-containers.yml", *args], cwd=ROOT, check=True,
                       capture_output=True)


def container(host):
    return f"llama-{NAME}-{host}"


def address(host):
    return f"{LINK}.10" if host == "master" else f"{LINK}.1{host[-1]}"


def inventory(directory):
    """The large cluster's inventory: the demo's settings, its own model, cluster addresses on the link."""
    directory = Path(directory)
    (directory / "group_vars").mkdir(parents=True)
    (directory / "host_vars").mkdir()
    (directory / "hosts.yml").write_text("\n".join([
        "all:", "  children:", "    llama_master:", "      hosts:", "        master:",
        f"          ansible_host: {container('master')}", "    llama_workers:", "      hosts:"] + [
        line for worker in WORKERS for line in (f"        {worker}:", f"          ansible_host: {container(worker)}")] + [
        "  vars:", "    ansible_connection: community.docker.docker"]) + "\n")
    settings = yaml.safe_load((ROOT / "inventory" / "demo" / "group_vars" / "all.yml").read_text())
    settings.update({
        "llama_model_path": "/srv/models/large.gguf", "llama_model_sha256": "", "llama_server_log_verbosity": 3,
        "llama_server_ctx_size": 512, "llama_metrics": False, "llama_link_check": True,
        # A cold load over 200 Mbit/s takes minutes: held requests must wait that long (L1's first deploy).
        "llama_front_hold_seconds": 900,
        # L4's upgrade changes one flag: the compiler cache makes its build a short one.
        "llamacpp_ccache_dir": "/var/cache/llamacpp-bench-ccache"})
    (directory / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
    for host in ("master",) + WORKERS:
        (directory / "host_vars" / f"{host}.yml").write_text(f"llama_cluster_address: {address(host)}\n")
    return str(directory)


def docker(host, command, check=True):
    return subprocess.run(["docker", "exec", container(host), "bash", "-c", command], capture_output=True, text=True,
                          check=check).stdout


def playbook(inv, name, *args, timeout=7200):
    result = run_playbook(name, *args, inventory=inv, timeout=timeout)
    output = result.stdout + result.stderr
    if os.environ.get("LLAMA_BENCH_LOGS"):  # as tools/bench.py keeps every playbook's output
        logs = Path(os.environ["LLAMA_BENCH_LOGS"])
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{time.strftime('%H%M%S')}-large-{Path(name).stem}.log").write_text(" ".join(args) + "\n" + output)
    if result.returncode != 0:
        sys.exit(f"{name} {' '.join(args)} failed:\n{output[-4000:]}")
    return output


def journal_load(since):
    """(started, stop, loaded) of llama-server's last load since `since` (monotonic s): its 'Started' (None without
    one), the first 'Stopping' since `since` (None without one), and the 'model loaded' after that start, on the
    monotonic clock."""
    out = docker("master", "journalctl -u llama-server.service -o json --no-pager --since -3h")
    started = stop = loaded = None
    for line in out.splitlines():
        entry = json.loads(line)
        at, message = int(entry["__MONOTONIC_TIMESTAMP"]) / 1e6, entry.get("MESSAGE")
        if at < since or not isinstance(message, str):
            continue
        if message.startswith("Stopping llama-server") and stop is None:
            stop = at
        elif message.startswith("Started llama-server"):
            started, loaded = at, None
        elif "model loaded" in message and started is not None and loaded is None:
            loaded = at
    if loaded is None:
        sys.exit(f"no 'model loaded' of llama-server in its journal since {since}")
    return started, stop, loaded


HEALTH = ("import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8081/health', timeout=2).status)")


def healthy():
    return docker("master", f"python3 -c {shlex.quote(HEALTH)} 2>/dev/null", check=False).strip() == "200"


class Memory:
    """The master's memory peaks while a `with` block runs (SAMPLER, on the master)."""

    def __enter__(self):
        docker("master", f"rm -f /tmp/mem.stop /tmp/mem.json; cat > /tmp/mem.py <<'EOF'\n{SAMPLER}\nEOF\n"
                         "nohup python3 /tmp/mem.py /tmp/mem.stop /tmp/mem.json > /dev/null 2>&1 &")
        return self

    def __exit__(self, *failure):
        docker("master", "touch /tmp/mem.stop")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = docker("master", "cat /tmp/mem.json 2>/dev/null", check=False)
            if out.strip():
                self.peak = json.loads(out)
                return False
            time.sleep(0.5)
        sys.exit("the master's memory sampler did not report")


def restart_load(link):
    """One restart of llama-server: (seconds started -> model loaded, bytes that crossed into the workers, the master's
    memory peaks)."""
    since = time.monotonic()
    with link.sampling() as sampled, Memory() as memory:
        docker("master", "systemctl restart llama-server.service")
        started, _, loaded = wait_loaded(since)
    _, received = sampled.crossed(started, loaded)
    return loaded - started, sum(received.values()), memory.peak


def wait_loaded(since, timeout=1800):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if healthy():
            return journal_load(since)
        time.sleep(1)
    sys.exit(f"llama-server did not load within {timeout} s")


def key(master):
    return docker("master", "cat /etc/llama.cpp/api-key 2>/dev/null", check=False).strip()


def measure(repeat, switch_report, wanted):
    """The L and M figures in `wanted`, on a cluster made for them and removed after. switch_report: tools/bench.py's
    reader of upgrade.yml's outage report."""
    paths = {name: fixtures.model(name, extra=args) for name, args in MODELS.items()}
    model_bytes = paths["large"].stat().st_size
    containers("present")
    try:
        link = link_bed.Link(link_bed.host_end(container("master"), address("master")),
                             {worker: link_bed.host_end(container(worker), address(worker)) for worker in WORKERS})
        for end in link.worker_ends.values():
            link_bed.shape(end, MBIT)
        with tempfile.TemporaryDirectory(prefix="llama-bench-large-") as directory:
            inv = inventory(directory)
            return run(inv, link, repeat, model_bytes, paths, switch_report, wanted)
    finally:
        containers("absent")


def run(inv, link, repeat, model_bytes, paths, switch_report, wanted):
    import testinfra  # pylint: disable=import-outside-toplevel

    notes = [f"model: {paths['large'].name} ({model_bytes / GIB:.2f} GiB, f16, 10 layers of 4096, every matrix over "
             f"the cache's threshold); links shaped to {MBIT} Mbit/s into each worker (tc tbf)"]
    figures = {}
    # L1's numerator: the first deploy without pre-fill, every weight over the links (else a pre-filled one).
    since = time.monotonic()
    with link.sampling() as sampled:
        output = playbook(inv, "site.yml", *(["-e", "llama_prefill_enabled=false"] if "L1" in wanted else []))
    started, _, loaded = journal_load(since)
    _, received = sampled.crossed(started, loaded)
    cold, cold_bytes = loaded - started, sum(received.values())
    said = re.search(r"(Loading \S+ \([\d.]+ GiB\) is expected to take .*? Waits for a load: \d+ s\.)",
                     " ".join(output.split()).replace('" }', ""))
    estimate = said.group(1) if said else "(preflight printed no estimate)"
    print(f"the first load took {cold:.0f} s, {cold_bytes / GIB:.2f} GiB crossed", flush=True)
    warm = [restart_load(link) for _ in range(repeat)]
    warm_s = [load for load, _, _ in warm]
    print(f"warm loads {[round(load, 1) for load in warm_s]} s", flush=True)
    if "L1" in wanted:
        figures["L1"] = bench_report.figure("L1", [cold], warm_s, crossed_bytes=cold_bytes, notes=notes + [
            f"the cold load sent {cold_bytes / GIB:.2f} GiB into the workers; a warm one "
            f"{max(sent for _, sent, _ in warm) / 2**20:.1f} MiB at most", f"preflight: {estimate}"])
    if "M1" in wanted:
        by_mode = {"auto": {"loads_s": warm_s, **max((peak for _, _, peak in warm), key=lambda peak: peak["rss"])}}
        playbook(inv, "site.yml", "-e", "llama_server_mmap=on")
        mapped = [restart_load(link) for _ in range(2)]
        by_mode["on"] = {"loads_s": [load for load, _, _ in mapped],
                         **max((peak for _, _, peak in mapped), key=lambda peak: peak["rss"])}
        playbook(inv, "site.yml")  # back to the default
        print(f"M1: {json.dumps(by_mode)}", flush=True)
        gib = {mode: round(peak["rss"] / GIB, 2) for mode, peak in by_mode.items()}
        figures["M1"] = bench_report.figure("M1", [by_mode["auto"]["rss"]], [model_bytes], by_mode=by_mode,
                                            notes=notes + [
            f"llama-server's peak resident memory during a warm load: {gib['auto']} GiB with the default "
            f"(llama_server_mmap auto: no mmap while the workers hold layers), {gib['on']} GiB with mmap (on); loads "
            f"{json.dumps({mode: [round(load, 1) for load in peak['loads_s']] for mode, peak in by_mode.items()})} s; "
            "the page cache grows by the model's size either way (reclaimable, not the process's)"])
    master = testinfra.get_host(f"docker://{container('master')}")
    clients = []
    if set(wanted) & {"L2", "L3", "L5"}:
        # A switch to the second model, pre-filled while the first serves, clients asking.
        with link.sampling() as sampled, ApiClients(master, key=key(master)) as switch_clients:
            switch_clients.event("site.yml switches to large-b")
            since = time.monotonic()
            output = playbook(inv, "site.yml", "-e", "llama_model_path=/srv/models/large-b.gguf")
            time.sleep(3)
        clients.append(switch_clients)
        started, stop, loaded = journal_load(since)
        sent, received = sampled.crossed(stop, loaded)
        _, prefilled = sampled.crossed(since, stop)
        outage = loaded - stop
        print(f"L2: the switch's outage {outage:.1f} s; inside it {sum(received.values())} bytes crossed", flush=True)
        fill = [" ".join(line.split()) for line in output.splitlines() if "pre-fill from" in line and "done" in line]
        figures["L2"] = bench_report.figure("L2", [outage], warm_s, notes=notes + [
            f"before the outage, the pre-fill moved {sum(prefilled.values()) / GIB:.2f} GiB into the workers while "
            "the first model served; the outage is llama-server stopping (a request in flight: up to 3 s) -> the "
            f"model loaded, the warm load llama-server started -> the model loaded; this outage: stopping -> started "
            f"{started - stop:.1f} s (the stop, then llama-wait-workers), started -> loaded {loaded - started:.1f} s"]
            + fill)
        figures["L3"] = bench_report.figure("L3", [sum(received.values())], [model_bytes], notes=notes + [
            f"inside the switch's outage the master sent {sent} bytes, the workers received {json.dumps(received)}"])
    if set(wanted) & {"L4", "L5"}:
        with ApiClients(master, key=key(master)) as upgrade_clients:
            upgrade_clients.event("upgrade.yml")
            upgrade_output = playbook(inv, "upgrade.yml", "-e", CHANGED_FLAG)
            time.sleep(3)
        clients.append(upgrade_clients)
        up_outage, up_load = switch_report(upgrade_output)
        after = [restart_load(link)[0] for _ in range(2)]
        figures["L4"] = bench_report.figure("L4", [up_outage], warm_s, notes=notes + [
            f"upgrade.yml to {CHANGED_FLAG}: outage {up_outage:.1f} s, of which llama-server's load {up_load:.1f} s "
            f"as upgrade.yml reports them (every node's processes new, the workers' RPC servers too); warm restarts "
            f"on the new build after it: {[round(load, 1) for load in after]} s"])
    if "L5" in wanted:
        requests = sum(len(rows) for group in clients for rows in group.results.values())
        failed = sum(len(rows) for group in clients for rows in group.failed().values())
        figures["L5"] = bench_report.figure("L5", [failed], [requests], notes=[
            "the continuity clients (1 every 0.5 s, 8 every 2 s) through the switch and the upgrade"])
    return figures
