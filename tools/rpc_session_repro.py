#!/usr/bin/env python3
"""Reproduce llama.cpp RPC worker crashes across master sessions, on one machine, without Ansible.

Two RPC servers on loopback stand in for the vulkan scenario's workers: worker1 offers its CPU, worker2 offers
`--worker2-devices` (default Vulkan0,CPU: Mesa's lavapipe and its CPU). A master (llama-server) then starts,
answers one completion and stops, over and over, with the plans given (`--plans`, used in turn): each start is a
new session for the same RPC server processes, as when site.yml restarts llama-server with a new split. After
every session both workers must still be running; a worker that died is reported with its signal and the last
lines it printed, then started again, and the rounds go on. The summary counts the crashes.

    tools/rpc_session_repro.py --bin-dir BUILD/bin --model smollm2.gguf --rounds 20 --load 2

A build of the llama.cpp tree with -DGGML_RPC=ON -DGGML_VULKAN=ON gives every binary used here (the master sees
no Vulkan device: lavapipe is a CPU-type device, skipped unless GGML_VK_VISIBLE_DEVICES names it). Options turn
the suspects off one at a time: `--no-cache` (the RPC server's -c), `--same-plan` (every session the first plan),
`--worker2-devices CPU` (no Vulkan), `--env MALLOC_CHECK_=3` (glibc's heap checks in the workers), `--load N` (N
CPU-bound processes beside it, as in the test suite), `--wrap` (a command prefix for worker2's server: gdb, a
chroot with another Mesa). `--fresh-workers` restarts both servers before every session; `--supervise` runs them
under the product's protection instead (roles/llama_rpc/files/llama-rpc-session, a fresh process per session),
and every master start waits as the master's unit does (roles/llama_server/files/llama-wait-workers). What it
found: docs/backends.md.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The product's protection: a fresh RPC server process per master session, and the master's wait for workers.
SESSION_GUARD = ROOT / "roles" / "llama_rpc" / "files" / "llama-rpc-session"
WAIT_WORKERS = ROOT / "roles" / "llama_server" / "files" / "llama-wait-workers"
PROMPT = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0, "seed": 1234,
          "cache_prompt": False}


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError(what)


def http(port, path, body=None, timeout=300):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        return None, str(error)


class Worker:
    """An RPC server process; its output goes to a log file of its own."""

    def __init__(self, name, args, workdir):
        self.name, self.args, self.workdir = name, args, workdir
        self.port = free_port()
        self.proc = None
        self.log = None
        self.starts = 0

    def start(self):
        self.starts += 1
        self.log = self.workdir / f"{self.name}.{self.starts}.log"
        env = dict(os.environ, LLAMA_CACHE=str(self.workdir / f"{self.name}-cache"), **self.args.env_overrides)
        if self.name == "worker2" and "Vulkan" in self.args.worker2_devices:
            env["GGML_VK_VISIBLE_DEVICES"] = "0"
        devices = "CPU" if self.name == "worker1" else self.args.worker2_devices
        command = [str(self.args.bin_dir / self.args.rpc_binary), "-H", "127.0.0.1", "-p", str(self.port),
                   "-t", "1", "-d", devices] + ([] if self.args.no_cache else ["-c"])
        wrap = shlex.split(self.args.wrap) if self.name == "worker2" else []
        supervisor = [sys.executable, str(SESSION_GUARD), "--"] if self.args.supervise else []
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(supervisor + ["stdbuf", "-oL", "-eL"] + wrap + command, stdout=out,
                                         stderr=subprocess.STDOUT, env=env)
        wait_until(lambda: accepts(self.port) or self.proc.poll() is not None, 120, f"{self.name} listens")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def ending(self):
        """How the process ended, and its last lines."""
        code = self.proc.returncode
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        tail = self.log.read_text(errors="replace").splitlines()[-self.args.tail:]
        return how, tail

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def master_session(args, workers, plan, workdir, round_no):
    """One llama-server session over the workers with `plan` (layers per device RPC0, RPC1, RPC2): start, one
    completion, stop. Returns (served, seconds to /health, detail)."""
    devices = [f"RPC{i}" for i, layers in enumerate(plan) if layers > 0]
    split = [str(layers) for layers in plan if layers > 0]
    port = free_port()
    # What the master's unit does first (ExecStartPre): each worker answers the RPC handshake.
    started = time.monotonic()
    waited = subprocess.run([sys.executable, str(WAIT_WORKERS), "60"]
                            + [f"{w.name}=127.0.0.1:{w.port}" for w in workers], capture_output=True, text=True)
    if waited.returncode != 0:
        return False, 0.0, f"workers did not answer: {waited.stderr.strip()}"
    master_session.waits.append(time.monotonic() - started)
    command = [str(args.master_bin_dir / "llama-server"), "-m", str(args.model), "-c", "1024", "-t", "1",
               "-ngl", "999", "--rpc", ",".join(f"127.0.0.1:{w.port}" for w in workers),
               "--device", ",".join(devices), "--tensor-split", ",".join(split),
               "--host", "127.0.0.1", "--port", str(port)]
    log = workdir / f"master.{round_no}.log"
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = started + 300
        while time.monotonic() < deadline and proc.poll() is None:
            status, _ = http(port, "/health", timeout=5)
            if status == 200:
                break
            time.sleep(0.1)
        loaded = time.monotonic() - started
        if proc.poll() is not None:
            return False, loaded, f"master exited {proc.returncode} before serving"
        status, text = http(port, "/completion", PROMPT)
        if status != 200:
            return False, loaded, f"completion: {status} {text[:200]}"
        return True, loaded, json.loads(text)["content"]
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


master_session.waits = []


def burners(count):
    """CPU-bound processes beside the cluster (the test suite's compilations stand-in)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", type=Path, required=True, help="the RPC servers' bin/ (a Vulkan+RPC build)")
    parser.add_argument("--master-bin-dir", type=Path, help="llama-server's bin/ (default: --bin-dir)")
    parser.add_argument("--rpc-binary", default="ggml-rpc-server")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--plans", nargs="+", default=["0,31,0", "11,10,10"],
                        help="layers per device RPC0,RPC1,RPC2, used in turn (default: the vulkan test's two)")
    parser.add_argument("--same-plan", action="store_true", help="every session uses the first plan")
    parser.add_argument("--no-cache", action="store_true", help="RPC servers without -c")
    parser.add_argument("--worker2-devices", default="Vulkan0,CPU")
    parser.add_argument("--fresh-workers", action="store_true", help="restart both RPC servers before each session")
    parser.add_argument("--supervise", action="store_true",
                        help="run the RPC servers under the product's llama-rpc-session (a fresh process per session)")
    parser.add_argument("--pause", type=float, default=0.5,
                        help="seconds between a session's end and the next start (a crash's abort shows meanwhile)")
    parser.add_argument("--load", type=int, default=0, help="CPU-bound processes to run beside it")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the RPC servers")
    parser.add_argument("--tail", type=int, default=12, help="lines of a dead worker's output to show")
    parser.add_argument("--wrap", default="", help="a command prefix for worker2 (e.g. gdb -batch -ex run -ex bt --args)")
    parser.add_argument("--stop-at-first-crash", action="store_true")
    parser.add_argument("--json", action="store_true", help="end with the figures as one JSON line")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    args.master_bin_dir = args.master_bin_dir or args.bin_dir
    args.env_overrides = dict(item.split("=", 1) for item in args.env)
    for binary in (args.bin_dir / args.rpc_binary, args.master_bin_dir / "llama-server", args.model):
        if not binary.is_file():
            parser.error(f"{binary}: no such file")
    plans = [[int(x) for x in plan.split(",")] for plan in args.plans]
    if args.same_plan:
        plans = plans[:1]

    workdir = Path(tempfile.mkdtemp(prefix="rpc-session-repro-"))
    workers = [Worker("worker1", args, workdir), Worker("worker2", args, workdir)]
    load = burners(args.load)
    crashes, failures, loads = [], 0, []
    try:
        for worker in workers:
            worker.start()
        for round_no in range(1, args.rounds + 1):
            if args.fresh_workers and round_no > 1:
                for worker in workers:
                    worker.stop()
                    worker.start()
            plan = plans[(round_no - 1) % len(plans)]
            served, loaded, detail = master_session(args, workers, plan, workdir, round_no)
            loads.append(loaded)
            time.sleep(args.pause)  # a dying worker's abort
            dead = [w for w in workers if not w.alive()]
            line = f"round {round_no:3d} plan {','.join(map(str, plan)):>10}: " + \
                   ("served" if served else "FAILED") + f" (health after {loaded:.1f} s) {detail!r}"
            print(line, flush=True)
            if not served:
                failures += 1
            for worker in dead:
                how, tail = worker.ending()
                crashes.append((round_no, worker.name, how))
                print(f"    {worker.name} died ({how}) in session {round_no}; its last lines:", flush=True)
                for text in tail:
                    print(f"      | {text}", flush=True)
                worker.start()
            if crashes and args.stop_at_first_crash:
                break
    finally:
        for worker in workers:
            worker.stop()
        for proc in load:
            proc.kill()
            proc.wait()
    print(f"\n{round_no} sessions, plans {' / '.join(','.join(map(str, p)) for p in plans)}, "
          f"worker2 devices {args.worker2_devices}, cache {'off' if args.no_cache else 'on'}, "
          f"{'fresh workers per session, ' if args.fresh_workers else ''}"
          f"{'llama-rpc-session, ' if args.supervise else ''}load {args.load}, "
          f"env {args.env_overrides or '-'}")
    print(f"worker crashes: {len(crashes)} {crashes}; failed sessions: {failures}; "
          f"median start to /health: {statistics.median(loads):.2f} s (of which waiting for the workers "
          f"{statistics.median(master_session.waits or [0]):.2f} s, longest {max(master_session.waits or [0]):.2f} s)")
    if args.keep or crashes:
        print(f"logs: {workdir}")
    else:
        shutil.rmtree(workdir)
    if args.json:
        print(json.dumps({"sessions": round_no, "crashes": crashes, "failed": failures,
                          "start_to_health_s": statistics.median(loads),
                          "wait_for_workers_s": statistics.median(master_session.waits or [0])}))
    return 1 if crashes or failures else 0


if __name__ == "__main__":
    sys.exit(main())
