#!/usr/bin/python
"""Ansible module llama_node_status: everything playbooks/status.yml shows of one node, read in one go."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_node_status
short_description: Read the state of one node of a llama.cpp RPC cluster, without changing it
description:
  - One read per node for C(playbooks/status.yml) and C(playbooks/verify.yml), and the source of the node's
    C(llama_cluster_*) metrics: the active build, the project's units, the established TCP connections, the
    memory the units hold, the host's memory and GPUs, the RPC tensor cache, the clock offset and the requests
    the API front holds.
  - Reads only; nothing is started, stopped or written. Missing pieces (a unit that is not installed, no
    chrony, no front) are reported as such, not as failures.
options:
  install_root:
    description: Where the llama.cpp builds are installed; C(<install_root>/current) is the active build.
    type: path
    default: /opt/llama.cpp
  units:
    description: The units to read (C(systemctl show)); a unit that is not installed is reported with
      C(load_state) C(not-found).
    type: list
    elements: str
    default: []
  server_unit:
    description: The unit of llama-server, on the master; its main process's command line is returned.
    type: str
  plan_file:
    description: The plan the master was deployed with (written by role llama_server), on the master.
    type: path
  cache_dir:
    description: The RPC server's tensor cache (C(llama_rpc_cache_dir)); its entries are C(<cache_dir>/rpc/*).
    type: path
  front_socket:
    description: The API front's HAProxy admin socket; the held requests are the sessions of its C(gate) frontend.
    type: path
  chrony:
    description: Read the clock offset from C(chronyc -c tracking).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: The module only reads.
  diff_mode:
    support: none
author: llamacpp-rpc-cluster
"""

EXAMPLES = r"""
- name: Read the worker's state
  llama_node_status:
    units: [llama-rpc-server.service, chrony.service]
    cache_dir: /var/cache/llama.cpp
  register: __status
"""

RETURN = r"""
build:
  description: The active build's BUILD-INFO.json (C({}) when there is none).
  returned: success
  type: dict
current:
  description: The directory C(current) resolves to (empty when there is no link).
  returned: success
  type: str
switched:
  description: When C(current) was last pointed somewhere (epoch seconds; 0 when there is no link).
  returned: success
  type: int
units:
  description: Per unit (in the order given) its name, load_state, active_state, sub_state, main_pid, restarts,
    since (epoch seconds the unit last became active, 0 if never), started (epoch seconds its main process started,
    0 when none), memory_bytes (its cgroup's, null when unknown), build_id (LLAMACPP_BUILD_ID of its environment)
    and the raw C(systemctl show) text (show).
  returned: success
  type: list
  elements: dict
cmdline:
  description: llama-server's command line (empty when it has no main process).
  returned: success
  type: list
  elements: str
connections:
  description: The host's established TCP connections, each C([local, peer]) as C(address:port).
  returned: success
  type: list
plan:
  description: The recorded plan (C(plan_file)), or C({}).
  returned: success
  type: dict
memory:
  description: The host's memory, C({total_bytes, available_bytes}).
  returned: success
  type: dict
gpus:
  description: NVIDIA GPUs seen by nvidia-smi (C({index, name, used_mib, total_mib})); empty without one.
  returned: success
  type: list
cache:
  description: The RPC tensor cache, C({entries, bytes}), or null without C(cache_dir).
  returned: success
  type: dict
clock:
  description: chrony's view, C({offset_s, leap, reference}), or null when chrony does not answer.
  returned: success
  type: dict
front:
  description: The front's C({held, sessions}) (requests the gate holds, connections to the API), or null.
  returned: success
  type: dict
"""

import json
import os
import re
import shutil
import socket
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

SHOW = ["Id", "LoadState", "ActiveState", "SubState", "MainPID", "NRestarts", "ActiveEnterTimestampMonotonic",
        "MemoryCurrent", "Environment"]


def parse_show(text):
    """`systemctl show UNIT... -p ...` output (one blank-line separated block per unit) as a list of dicts."""
    blocks = []
    for block in re.split(r"\n\s*\n", str(text).strip()):
        if block.strip():
            blocks.append(dict(line.split("=", 1) for line in block.splitlines() if "=" in line))
    return blocks


def boot_time():
    """When this host booted (epoch seconds)."""
    with open("/proc/uptime", encoding="ascii") as uptime:
        return time.time() - float(uptime.read().split()[0])


def unit_state(name, show, started, booted):
    """One unit's state from its `systemctl show` block, its main process's start (epoch seconds, 0: none) and the
    host's boot time (epoch seconds)."""
    environment = show.get("Environment", "")
    build = re.search(r"(?:^|\s)LLAMACPP_BUILD_ID=(\S+)", environment)
    memory = show.get("MemoryCurrent", "")
    entered = show.get("ActiveEnterTimestampMonotonic", "0")
    return {
        "name": name,
        "load_state": show.get("LoadState", "not-found"),
        "active_state": show.get("ActiveState", "unknown"),
        "sub_state": show.get("SubState", ""),
        "main_pid": int(show.get("MainPID", "0") or 0),
        "restarts": int(show.get("NRestarts", "0") or 0),
        "since": int(booted + int(entered) / 1e6) if entered.isdigit() and int(entered) > 0 else 0,
        "started": int(started or 0),
        "memory_bytes": int(memory) if memory.isdigit() else None,
        "build_id": build.group(1) if build else "",
        "show": "\n".join(f"{key}={show[key]}" for key in ("ActiveState", "MainPID", "Environment") if key in show),
    }


def parse_connections(text):
    """`ss -Htn state established` lines (Recv-Q Send-Q Local Peer) as [local, peer] pairs."""
    return [fields[2:4] for fields in map(str.split, str(text).splitlines()) if len(fields) >= 4]


def parse_tracking(text):
    """`chronyc -c tracking` (CSV: reference id, name, stratum, ref time, system offset, last offset, ...,
    leap status last) as {offset_s, leap, reference}, or None when it does not parse."""
    fields = str(text).strip().split(",")
    if len(fields) < 14:
        return None
    try:
        return {"offset_s": float(fields[4]), "leap": fields[-1], "reference": fields[1]}
    except ValueError:
        return None


def parse_front_stat(csv_text):
    """HAProxy `show stat` CSV: the requests the gate frontend holds and the sessions of the api frontend."""
    lines = [line for line in str(csv_text).splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        return None
    header = lines[0][2:].split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    current = {row.get("pxname"): int(row.get("scur") or 0) for row in rows if row.get("svname") == "FRONTEND"}
    return {"held": current.get("gate", 0), "sessions": current.get("api", 0)}


def parse_nvidia_smi(text):
    """`nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader,nounits` lines."""
    gpus = []
    for line in str(text).splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) == 4 and fields[0].isdigit():
            gpus.append({"index": int(fields[0]), "name": fields[1], "used_mib": int(float(fields[2])),
                         "total_mib": int(float(fields[3]))})
    return gpus


def parse_meminfo(text):
    values = dict(re.findall(r"^(\w+):\s+(\d+) kB", str(text), re.M))
    return {"total_bytes": int(values.get("MemTotal", 0)) * 1024,
            "available_bytes": int(values.get("MemAvailable", 0)) * 1024}


def process_start(pid, booted):
    """When process `pid` started (epoch seconds), 0 when there is none."""
    if not pid:
        return 0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0
    return int(booted + ticks / os.sysconf("SC_CLK_TCK"))


def cache_usage(path):
    entries = total = 0
    folder = os.path.join(path, "rpc")
    try:
        with os.scandir(folder) as found:
            for entry in found:
                if entry.is_file(follow_symlinks=False):
                    entries += 1
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return {"entries": entries, "bytes": total}


def front_stat(path):
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as admin:
            admin.settimeout(2)
            admin.connect(path)
            admin.sendall(b"show stat\n")
            chunks = []
            while True:
                chunk = admin.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    return parse_front_stat(b"".join(chunks).decode("utf-8", "replace"))


def _run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def read_node(params):
    current_link = os.path.join(params["install_root"], "current")
    result = {"build": {}, "current": "", "switched": 0, "units": [], "cmdline": [], "connections": [], "plan": {},
              "memory": parse_meminfo(_read("/proc/meminfo") or ""), "gpus": [], "cache": None, "clock": None,
              "front": None}
    if os.path.islink(current_link):
        result["current"] = os.path.realpath(current_link)
        result["switched"] = int(os.lstat(current_link).st_mtime)
        info = _read(os.path.join(current_link, "BUILD-INFO.json"))
        try:
            result["build"] = json.loads(info) if info else {}
        except ValueError:
            result["build"] = {}
    if params["units"]:
        booted = boot_time()
        shown = _run(["systemctl", "show", *params["units"], "-p", ",".join(SHOW)]) or ""
        by_name = {block.get("Id"): block for block in parse_show(shown)}
        for name in params["units"]:
            show = by_name.get(name, {})
            started = process_start(int(show.get("MainPID", "0") or 0), booted)
            result["units"].append(unit_state(name, show, started, booted))
    server = next((unit for unit in result["units"] if unit["name"] == params.get("server_unit")), None)
    if server and server["main_pid"]:
        cmdline = _read(f"/proc/{server['main_pid']}/cmdline")
        result["cmdline"] = cmdline.rstrip("\0").split("\0") if cmdline else []
    result["connections"] = parse_connections(_run(["ss", "-Htn", "state", "established"]) or "")
    if params.get("plan_file"):
        plan = _read(params["plan_file"])
        try:
            result["plan"] = json.loads(plan) if plan else {}
        except ValueError:
            result["plan"] = {}
    if shutil.which("nvidia-smi"):
        result["gpus"] = parse_nvidia_smi(_run(["nvidia-smi", "--query-gpu=index,name,memory.used,memory.total",
                                                "--format=csv,noheader,nounits"]) or "")
    if params.get("cache_dir"):
        result["cache"] = cache_usage(params["cache_dir"])
    if params["chrony"] and shutil.which("chronyc"):
        result["clock"] = parse_tracking(_run(["chronyc", "-c", "tracking"]) or "")
    if params.get("front_socket"):
        result["front"] = front_stat(params["front_socket"])
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "install_root": {"type": "path", "default": "/opt/llama.cpp"},
            "units": {"type": "list", "elements": "str", "default": []},
            "server_unit": {"type": "str"},
            "plan_file": {"type": "path"},
            "cache_dir": {"type": "path"},
            "front_socket": {"type": "path"},
            "chrony": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **read_node(module.params))


if __name__ == "__main__":
    main()
