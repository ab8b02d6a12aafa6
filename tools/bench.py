#!/usr/bin/env python3
"""make bench / tools/bench.py -i INVENTORY: the cluster's speed claims, each a ratio of two medians measured in one
run against its natural reference, written to bench/<date>-<commit>.{json,md} with plots, and appended to
bench/history.jsonl (tools/bench_report.py computes and draws).

Figures measured here (the others of tools/bench_report.SPECS are listed as not measured, with the reason):
  P3  a no-op site.yml ÷ a fresh site.yml on fresh hosts (--fresh: the demo's containers are made again first; the
      build comes from the artifact cache), once per run; the no-op run must report changed=0.
  P5  decode tok/s through the cluster's API ÷ the same llama-server binary, arguments and workers started by hand
      (a transient unit, without the project's unit, front or watch), on the master, requests from the master.

The cluster is exclusive while it runs: llama-server is stopped for the hand-started one, and started again in any
case. Usage: tools/bench.py [-i inventory/demo] [--figures P3,P5] [--repeat 3] [--fresh] [--out bench]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import testinfra

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "molecule" / "shared"))
import bench_report  # noqa: E402  # pylint: disable=wrong-import-position
from cluster_helpers import cmdline, main_pid, recap, run_playbook, wait_health  # noqa: E402  # pylint: disable=wrong-import-position

MEASURED = ("P3", "P5")
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
def inventory_groups(inventory):
    listing = json.loads(subprocess.run(["ansible-inventory", "-i", inventory, "--list"], check=True,
                                        capture_output=True, text=True, cwd=ROOT).stdout)
    return {name: group.get("hosts", []) for name, group in listing.items() if isinstance(group, dict)}


def host(inventory, name):
    """A testinfra host for an inventory host. The demo's are containers whose names the inventory templates
    (ansible_host: llama-demo-{{ inventory_hostname }}), which testinfra's ansible backend does not: Ansible says."""
    message = "{{ ansible_connection | default('ssh') }} {{ ansible_host | default(inventory_hostname) }}"
    shown = subprocess.run(["ansible", name, "-i", inventory, "-o", "-m", "ansible.builtin.debug", "-a",
                            json.dumps({"msg": message})], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    connection, address = json.loads(shown.split("=>", 1)[1])["msg"].split()
    if connection.endswith("docker"):
        return testinfra.get_host(f"docker://{address}")
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}")


def python(node, script, *args):
    return node.check_output(f"python3 -c {shlex.quote(script)} " + " ".join(shlex.quote(str(arg)) for arg in args))


def timed_playbook(inventory, playbook, *args):
    began = time.monotonic()
    result = run_playbook(playbook, *args, inventory=inventory, timeout=7200)
    seconds = time.monotonic() - began
    output = result.stdout + result.stderr
    if result.returncode != 0:
        sys.exit(f"{playbook} failed:\n{output[-4000:]}")
    return seconds, output


def measure_p3(inventory, fresh):
    """One fresh converge (the demo's containers made again) and the no-op run after it."""
    if not fresh:
        return bench_report.skipped("P3", "needs fresh hosts: --fresh makes the demo's containers again")
    for state in ("absent", "present"):
        subprocess.run(["ansible-playbook", "tools/demo-containers.yml", "-e", f"demo_state={state}"],
                       cwd=ROOT, check=True, capture_output=True)
    converge, _ = timed_playbook(inventory, "site.yml")
    rerun, output = timed_playbook(inventory, "site.yml")
    changed = {name: stats["changed"] for name, stats in recap(output).items() if stats["changed"]}
    if changed:
        sys.exit(f"P3: the second site.yml changed something: {changed}")
    return bench_report.figure("P3", [rerun], [converge])


def server_argv(master):
    """llama-server's argv and environment as its unit runs it (from /proc of its main process)."""
    pid = main_pid(master, "llama-server.service")
    environ = master.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
    keep = [line for line in environ if re.match(r"(LLAMA_|GGML_|CUDA_|HIP_|ROCR_|LD_LIBRARY_PATH)", line)]
    return cmdline(master, pid), keep


def option(argv, name, default=""):
    return argv[argv.index(name) + 1] if name in argv else default


def requests(master, url, key_file, repeat):
    python(master, REQUEST, url, key_file)  # warm-up
    samples = [json.loads(python(master, REQUEST, url, key_file)) for _ in range(repeat)]
    return [tokens / seconds for tokens, seconds, _ in samples], [decode for _, _, decode in samples]


def measure_p5(inventory, groups, repeat):
    master = host(inventory, groups["llama_master"][0])
    argv, environ = server_argv(master)
    key_file = option(argv, "--api-key-file")
    api = master.check_output("systemctl show -p Description --value llama-front.service 2>/dev/null || true")
    port = re.search(r"on [\d.]+:(\d+)", api)
    cluster_port = int(port.group(1) if port else option(argv, "--port", "8080"))
    cluster_url = f"http://127.0.0.1:{cluster_port}"
    cluster, cluster_decode = requests(master, cluster_url, key_file, repeat)
    hand_argv = list(argv)
    for flag, value in (("--port", str(HAND_PORT)), ("--host", "127.0.0.1")):
        if flag in hand_argv:
            hand_argv[hand_argv.index(flag) + 1] = value
        else:
            hand_argv += [flag, value]
    settings = " ".join(f"--setenv={shlex.quote(line)}" for line in environ)
    master.check_output("systemctl stop llama-server-watch.service llama-server.service")
    try:
        # A worker's RPC server takes a moment to serve its next client after llama-server's session ended: started
        # before, llama-server aborts ("Remote RPC server crashed"), and is started again, as one would by hand.
        master.check_output(f"systemd-run --quiet --collect --unit={HAND_UNIT} -p User=llama -p Restart=on-failure "
                            f"-p RestartSec=1 {settings} " + " ".join(shlex.quote(arg) for arg in hand_argv))
        wait_health(master, HAND_PORT, timeout=300)
        hand, hand_decode = requests(master, f"http://127.0.0.1:{HAND_PORT}", key_file, repeat)
    finally:
        master.run(f"systemctl stop {HAND_UNIT}.service")
        master.check_output("systemctl start llama-server.service llama-server-watch.service")
        wait_health(master, cluster_port, timeout=600)
    return bench_report.figure(
        "P5", cluster, hand, decode_tps={"cluster": cluster_decode, "by hand": hand_decode},
        notes=[f"end-to-end tok/s of 64-token greedy requests from the master (llama-server's own decode tok/s: "
               f"cluster {bench_report.median(cluster_decode):.1f}, by hand {bench_report.median(hand_decode):.1f})"])


def commit():
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip() or "unknown"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--inventory", default=str(ROOT / "inventory" / "demo"))
    parser.add_argument("--figures", default=",".join(MEASURED), help="comma-separated, of " + ", ".join(MEASURED))
    parser.add_argument("--repeat", type=int, default=3, help="measurements of each side of a ratio")
    parser.add_argument("--fresh", action="store_true", help="make the demo's containers again for P3")
    parser.add_argument("--out", default=str(ROOT / "bench"))
    args = parser.parse_args(argv)
    wanted = [name.strip() for name in args.figures.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in MEASURED]
    if unknown:
        parser.error(f"unknown figures {unknown}: this tool measures {', '.join(MEASURED)}")
    os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    inventory = str(Path(args.inventory).resolve())
    groups = inventory_groups(inventory)
    figures = {}
    for spec_id in bench_report.SPECS:
        if spec_id not in wanted:
            reason = "not asked for (--figures)" if spec_id in MEASURED else "not measured by this version"
            figures[spec_id] = bench_report.skipped(spec_id, reason)
        elif spec_id == "P3":
            figures[spec_id] = measure_p3(inventory, args.fresh)
        elif spec_id == "P5":
            figures[spec_id] = measure_p5(inventory, groups, args.repeat)
        print(f"{spec_id}: {bench_report.shown(figures[spec_id])} ({bench_report.verdict(figures[spec_id])})",
              flush=True)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rec = bench_report.record(figures, date=now, commit=commit(), inventory=args.inventory, repeat=args.repeat)
    report = bench_report.write(rec, args.out)
    print(bench_report.table(rec))
    print(f"report: {report}")


if __name__ == "__main__":
    main()
