"""What one node of a llama.cpp RPC cluster runs, read with nothing but the Python standard library: the module
llama_node_status (playbooks/status.yml, verify.yml) and the node's metrics exporter (role llama_metrics, which
installs this file beside it) read through the same code."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import http.client
import urllib.parse

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


PLAN_LINE = "# llama-cluster-plan: "


def parse_plan(unit_text):
    """The plan llama-server's unit was rendered with: the JSON of its `# llama-cluster-plan:` line, {} without."""
    for line in str(unit_text).splitlines():
        if line.startswith(PLAN_LINE):
            try:
                plan = json.loads(line[len(PLAN_LINE):])
            except ValueError:
                return {}
            return plan if isinstance(plan, dict) else {}
    return {}


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
    """HAProxy `show stat` CSV: the requests the front holds (the gate's sessions that it has not passed on to
    llama-server yet: a request being answered is a session of the gate too) and the api frontend's sessions."""
    lines = [line for line in str(csv_text).splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        return None
    header = lines[0][2:].split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    current = {(row.get("pxname"), row.get("svname")): int(row.get("scur") or 0) for row in rows}
    held = current.get(("gate", "FRONTEND"), 0) - current.get(("llama_server", "BACKEND"), 0)
    return {"held": max(held, 0), "sessions": current.get(("api", "FRONTEND"), 0)}


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


# llama-server's "model loaded" line in the journal (journalctl -o short-unix): the journal's time, and the line's own
# clock where it has one (0c1e570 prefixes minutes.seconds.ms.us since the process started; older trees nothing).
_JOURNAL_LINE = re.compile(r"^(\d+(?:\.\d+)?) \S+ [^:]+: (.*)$")
_OWN_CLOCK = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ")


def parse_loaded(text, started):
    """Seconds llama-server took from its start to its model loaded, from its journal's last `model loaded` line
    (short-unix output): the line's own clock where it has one, else the line's time less `started` (epoch
    seconds, 0: unknown). None without such a line (still loading, or the journal rotated it away)."""
    for line in reversed(str(text).splitlines()):
        entry = _JOURNAL_LINE.match(line)
        if not entry or "model loaded" not in entry.group(2):
            continue
        own = _OWN_CLOCK.match(entry.group(2))
        if own:
            minutes, seconds, millis, micros = (int(part) for part in own.groups())
            return round(minutes * 60 + seconds + millis / 1e3 + micros / 1e6, 3)
        return round(max(float(entry.group(1)) - started, 0.0), 3) if started else None
    return None


# llama.cpp's load log, per device: "using device RPC0 (10.0.0.2:50052) ..." names each device (an RPC device by its
# endpoint); "layer 3 assigned to device RPC0, ..." (a debug line: --verbose only) places each layer;
# "RPC0[10.0.0.2:50052] model buffer size = 40.51 MiB" (an RPC buffer named by its endpoint) or "CUDA0 model buffer
# size = ..." sizes the weights each device holds.
_USING = re.compile(r"using device (\S+) \(([^)]*)\)")
_ASSIGNED = re.compile(r"layer\s+\d+ assigned to device ([^\s,]+)")
_BUFFER = re.compile(r"\s(\S+?)(?:\[([^\]]+)\])? model buffer size =\s*([\d.]+) MiB")
LOAD_LOG = "model loaded|using device|assigned to device|model buffer size"


def parse_devices(text):
    """What llama-server loaded onto each of its devices, from its load log (the lines of one process): {device:
    {layers, model_bytes}}; layers is null without llama.cpp's debug log (--verbose), model_bytes null where the log
    has no buffer of that device. Host buffers (CPU, CPU_Mapped) are not devices of the plan and are left out."""
    devices, endpoints = {}, {}
    for line in str(text).splitlines():
        using = _USING.search(line)
        if using:
            devices.setdefault(using.group(1), {"layers": None, "model_bytes": None})
            endpoints.setdefault(using.group(2), []).append(using.group(1))
            continue
        assigned = _ASSIGNED.search(line)
        if assigned:
            device = devices.setdefault(assigned.group(1), {"layers": None, "model_bytes": None})
            device["layers"] = (device["layers"] or 0) + 1
            continue
        buffer = _BUFFER.search(line)
        if buffer:
            name, endpoint, mib = buffer.groups()
            # An RPC buffer names the endpoint, not the device: the device is the one llama.cpp uses there.
            owners = endpoints.get(endpoint, []) if endpoint else [name]
            if len(owners) == 1 and owners[0] in devices:
                devices[owners[0]]["model_bytes"] = int(float(mib) * 1048576)
    return devices


def server_load(pid, started, known=None):
    """What llama-server's process `pid` (started at `started`, epoch s) loaded, from its journal: {load_s
    (parse_loaded), devices (parse_devices)}. `known` (the same, with its pid) answers without reading the journal
    when it is about the same process and complete (the exporter keeps it between runs: a --verbose journal is
    long)."""
    if known and known.get("pid") == pid and known.get("load_s") is not None and "devices" in known:
        return {"load_s": known["load_s"], "devices": known["devices"]}
    # Since the process started: a PID of an earlier process (another boot, a restarted container) is not it.
    since = ["--since", f"@{max(int(started) - 1, 0)}"] if started else []
    found = _run(["journalctl", f"_PID={pid}", *since, "-o", "short-unix", "--no-pager", "-q", "-g", LOAD_LOG]) or ""
    return {"load_s": parse_loaded(found, started), "devices": parse_devices(found)}


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


def probe_health(url, timeout=3.0):
    """GET `url` (llama-server's /health, an http URL, directly or through the front): {url, status (the HTTP status,
    None when nothing answered), error (why it is not 200: llama-server's error message, or what the connection
    did)}. http.client, not Ansible's open_url: the exporter runs this without Ansible."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        connection.request("GET", parts.path or "/")
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as err:
        return {"url": url, "status": None, "error": str(err) or type(err).__name__}
    finally:
        connection.close()
    if response.status == 200:
        return {"url": url, "status": 200, "error": ""}
    try:
        body = json.loads(text or "{}")
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    reason = error.get("message") if isinstance(error, dict) else None
    return {"url": url, "status": response.status, "error": reason or response.reason}


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


def read_node(install_root="/opt/llama.cpp", units=(), server_unit=None, plan_file=None, cache_dir=None,
              front_socket=None, chrony=True, known_load=None, health=None):
    """Everything llama_node_status returns (its RETURN documents the fields); reads only. `health`: {path: URL of
    llama-server's /health}, asked each (`server`: directly, `front`: through the API front)."""
    current_link = os.path.join(install_root, "current")
    result = {"build": {}, "current": "", "switched": 0, "units": [], "cmdline": [], "connections": [], "plan": {},
              "memory": parse_meminfo(_read("/proc/meminfo") or ""), "gpus": [], "cache": None, "clock": None,
              "front": None, "load_s": None, "loaded": {}, "health": {}}
    if os.path.islink(current_link):
        result["current"] = os.path.realpath(current_link)
        result["switched"] = int(os.lstat(current_link).st_mtime)
        info = _read(os.path.join(current_link, "BUILD-INFO.json"))
        try:
            result["build"] = json.loads(info) if info else {}
        except ValueError:
            result["build"] = {}
    if units:
        booted = boot_time()
        shown = _run(["systemctl", "show", *units, "-p", ",".join(SHOW)]) or ""
        by_name = {block.get("Id"): block for block in parse_show(shown)}
        for name in units:
            show = by_name.get(name, {})
            started = process_start(int(show.get("MainPID", "0") or 0), booted)
            result["units"].append(unit_state(name, show, started, booted))
    server = next((unit for unit in result["units"] if unit["name"] == server_unit), None)
    if server and server["main_pid"]:
        cmdline = _read(f"/proc/{server['main_pid']}/cmdline")
        result["cmdline"] = cmdline.rstrip("\0").split("\0") if cmdline else []
        if server["active_state"] == "active":
            load = server_load(server["main_pid"], server["started"], known_load)
            result["load_s"], result["loaded"] = load["load_s"], load["devices"]
    result["connections"] = parse_connections(_run(["ss", "-Htn", "state", "established"]) or "")
    if plan_file:
        result["plan"] = parse_plan(_read(plan_file) or "")
    if shutil.which("nvidia-smi"):
        result["gpus"] = parse_nvidia_smi(_run(["nvidia-smi", "--query-gpu=index,name,memory.used,memory.total",
                                                "--format=csv,noheader,nounits"]) or "")
    if cache_dir:
        result["cache"] = cache_usage(cache_dir)
    if chrony and shutil.which("chronyc"):
        result["clock"] = parse_tracking(_run(["chronyc", "-c", "tracking"]) or "")
    if front_socket:
        result["front"] = front_stat(front_socket)
    result["health"] = {path: probe_health(url) for path, url in (health or {}).items() if url}
    return result


# The node's llama_cluster_* metrics (role llama_metrics: this file, run by a timer, writes them for node-exporter's
# textfile collector). Metric name: (type, help).
METRICS = {
    "llama_cluster_build_info": ("gauge", "The active llama.cpp build (1), by commit, backend, RPC protocol and id."),
    "llama_cluster_unit_active": ("gauge", "Whether the unit is active (1) or not (0)."),
    "llama_cluster_unit_restarts_total": ("counter", "How often systemd restarted the unit after a failure "
                                                     "(NRestarts)."),
    "llama_cluster_unit_memory_bytes": ("gauge", "Memory of the unit's cgroup (an RPC server: the layers it holds)."),
    "llama_cluster_worker_up": ("gauge", "On a worker: whether its RPC server unit is active."),
    "llama_cluster_worker_connected": ("gauge", "On a worker: whether the master holds a connection to its RPC port."),
    "llama_cluster_server_up": ("gauge", "On the master: whether llama-server is active."),
    "llama_cluster_api_healthy": ("gauge", "On the master: whether llama-server's /health answers 200, directly "
                                           "(path server) and through the API front (path front)."),
    "llama_cluster_rpc_endpoints_planned": ("gauge", "On the master: the RPC endpoints of llama-server's --rpc."),
    "llama_cluster_rpc_endpoints_connected": ("gauge", "On the master: those llama-server holds a connection to."),
    "llama_cluster_device_planned_layers": ("gauge", "On the master: the layers the plan gives each device."),
    "llama_cluster_device_planned_bytes": ("gauge", "On the master: the bytes the plan estimates on each device."),
    "llama_cluster_device_loaded_layers": ("gauge", "On the master: the layers llama.cpp placed on each device (its "
                                                    "load log; llama-server with --verbose only)."),
    "llama_cluster_device_loaded_bytes": ("gauge", "On the master: the model weights llama.cpp loaded onto each device "
                                                   "(its load log's model buffer)."),
    "llama_cluster_model_info": ("gauge", "On the master: the served model (1), by source, sha256 and mode."),
    "llama_cluster_model_load_seconds": ("gauge", "On the master: how long llama-server took from its start to its "
                                                  "model loaded (the running process; absent while it loads)."),
    "llama_cluster_rpc_cache_bytes": ("gauge", "On a worker: the RPC tensor cache's size."),
    "llama_cluster_rpc_cache_max_bytes": ("gauge", "On a worker: the cache's cap (llama_rpc_cache_max_mib)."),
    "llama_cluster_clock_offset_seconds": ("gauge", "chrony's offset of the system clock (chronyc tracking)."),
    "llama_cluster_front_held_requests": ("gauge", "On the master: the requests the API front holds now."),
    "llama_cluster_front_sessions": ("gauge", "On the master: the client connections of the API front."),
    "llama_cluster_gpu_memory_used_bytes": ("gauge", "Memory used on each NVIDIA GPU (nvidia-smi)."),
    "llama_cluster_gpu_memory_total_bytes": ("gauge", "Memory of each NVIDIA GPU (nvidia-smi)."),
    "llama_cluster_exporter_timestamp_seconds": ("gauge", "When these metrics were read (a stale file stops)."),
}


def _labels(labels):
    if not labels:
        return ""
    escaped = (str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for value in labels.values())
    return "{" + ",".join(f'{name}="{value}"' for name, value in zip(labels, escaped)) + "}"


def rpc_endpoints(cmdline):
    """The --rpc endpoints of llama-server's command line (a list)."""
    argv = list(cmdline or [])
    return argv[argv.index("--rpc") + 1].split(",") if "--rpc" in argv[:-1] else []


def worker_connected(connections, endpoint, master_address):
    """Whether `master_address` holds a connection to a worker's RPC `endpoint` (address:port), from the worker's
    established connections ([local, peer] pairs)."""
    return master_address in {str(peer).rsplit(":", 1)[0] for here, peer in connections or [] if here == endpoint}


def missing_endpoints(cmdline, connections):
    """(planned, missing): the --rpc endpoints of llama-server's command line, and those of them the master's
    established connections ([local, peer] pairs) hold none to. Not by process: reading another user's sockets needs
    ptrace rights that a container's root lacks, and nothing else on the master connects to a worker's RPC port."""
    planned = rpc_endpoints(cmdline)
    held = {str(pair[1]) for pair in connections or [] if len(pair) >= 2}
    return planned, [endpoint for endpoint in planned if endpoint not in held]


INSTANCE_UNIT = re.compile(r"^llama-(?:rpc-)?server(?:-(?P<name>[a-z][a-z0-9-]*))?\.service$")


def unit_instance(unit):
    """{"llama_instance": NAME} for a unit of an instance (llama_instances, docs/instances.md): `default` for the
    cluster's own llama-server and RPC server, NAME for llama-server-NAME and llama-rpc-server-NAME; {} for another
    unit (llama-server-watch is the cluster's own watcher, not an instance). Not `instance`: Prometheus gives that
    label the target."""
    match = INSTANCE_UNIT.match(unit)
    if not match or match.group("name") == "watch":
        return {}
    return {"llama_instance": match.group("name") or "default"}


def node_metrics(read, node, now=None):
    """The Prometheus text of one node: `read` is read_node()'s result, `node` says what the node is ({master,
    worker (bools), address, rpc_port, master_address, cache_max_mib})."""
    samples = []  # (name, labels, value)
    build = read.get("build") or {}
    if build:
        samples.append(("llama_cluster_build_info", {"commit": build.get("commit", ""),
                                                     "backend": build.get("backend", ""),
                                                     "protocol": build.get("rpc_proto", ""),
                                                     "build_id": build.get("build_id", "")}, 1))
    units = {unit["name"]: unit for unit in read.get("units") or [] if unit.get("load_state") != "not-found"}
    for name, unit in units.items():
        labels = dict({"unit": name}, **unit_instance(name))
        samples.append(("llama_cluster_unit_active", labels, int(unit.get("active_state") == "active")))
        samples.append(("llama_cluster_unit_restarts_total", labels, unit.get("restarts", 0)))
        if unit.get("memory_bytes") is not None:
            samples.append(("llama_cluster_unit_memory_bytes", labels, unit["memory_bytes"]))
    if node.get("worker"):
        rpc = units.get("llama-rpc-server.service", {})
        samples.append(("llama_cluster_worker_up", {}, int(rpc.get("active_state") == "active")))
        connected = worker_connected(read.get("connections"), f"{node.get('address')}:{node.get('rpc_port')}",
                                     node.get("master_address"))
        samples.append(("llama_cluster_worker_connected", {}, int(connected)))
        cache = read.get("cache")
        if cache is not None:
            samples.append(("llama_cluster_rpc_cache_bytes", {}, cache["bytes"]))
            samples.append(("llama_cluster_rpc_cache_max_bytes", {}, int(node.get("cache_max_mib") or 0) * 1048576))
    if node.get("master"):
        server = units.get("llama-server.service", {})
        samples.append(("llama_cluster_server_up", {}, int(server.get("active_state") == "active")))
        for path, answer in sorted((read.get("health") or {}).items()):
            samples.append(("llama_cluster_api_healthy", {"path": path}, int(answer.get("status") == 200)))
        record = read.get("plan") or {}
        planned, missing = missing_endpoints(read.get("cmdline"), read.get("connections"))
        samples.append(("llama_cluster_rpc_endpoints_planned", {}, len(planned or record.get("rpc") or [])))
        samples.append(("llama_cluster_rpc_endpoints_connected", {}, len(planned) - len(missing)))
        plan, hosts = record.get("plan") or {}, record.get("hosts") or {}
        for device, (first, end), size in zip(plan.get("devices") or [], plan.get("layers") or [],
                                              plan.get("bytes") or []):
            labels = {"device": device, "host": hosts.get(device, "")}
            samples.append(("llama_cluster_device_planned_layers", labels, end - first))
            samples.append(("llama_cluster_device_planned_bytes", labels, size))
            loaded = (read.get("loaded") or {}).get(device) or {}
            if loaded.get("layers") is not None:
                samples.append(("llama_cluster_device_loaded_layers", labels, loaded["layers"]))
            if loaded.get("model_bytes") is not None:
                samples.append(("llama_cluster_device_loaded_bytes", labels, loaded["model_bytes"]))
        model = record.get("model") or {}
        if model:
            samples.append(("llama_cluster_model_info", {"source": model.get("source", ""),
                                                         "sha256": model.get("sha256", ""),
                                                         "mode": model.get("mode", "")}, 1))
        if read.get("load_s") is not None:
            samples.append(("llama_cluster_model_load_seconds", {}, read["load_s"]))
        front = read.get("front")
        if front is not None:
            samples.append(("llama_cluster_front_held_requests", {}, front["held"]))
            samples.append(("llama_cluster_front_sessions", {}, front["sessions"]))
    clock = read.get("clock")
    if clock is not None:
        samples.append(("llama_cluster_clock_offset_seconds", {}, clock["offset_s"]))
    for gpu in read.get("gpus") or []:
        labels = {"gpu": str(gpu["index"]), "name": gpu["name"]}
        samples.append(("llama_cluster_gpu_memory_used_bytes", labels, gpu["used_mib"] * 1048576))
        samples.append(("llama_cluster_gpu_memory_total_bytes", labels, gpu["total_mib"] * 1048576))
    samples.append(("llama_cluster_exporter_timestamp_seconds", {}, round(time.time() if now is None else now, 3)))
    lines = []
    for name, (kind, text) in METRICS.items():
        chosen = [(labels, value) for metric, labels, value in samples if metric == name]
        if chosen:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{_labels(labels)} {value}" for labels, value in chosen]
    return "\n".join(lines) + "\n"


def export(config_path, out_path):
    """The exporter: read the node as its config says, write the metrics for the textfile collector (atomically)."""
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    # What the last run found of llama-server's load, kept beside the metrics (node-exporter reads only *.prom).
    state_path = f"{out_path}.state.json"
    try:
        state = json.loads(_read(state_path) or "{}")
    except ValueError:
        state = {}
    read = read_node(**config["read"], known_load=state.get("load"))
    text = node_metrics(read, config["node"])
    server = next((unit for unit in read["units"] if unit["name"] == config["read"].get("server_unit")), None)
    load = {"pid": server["main_pid"], "load_s": read["load_s"], "devices": read["loaded"]} if server else None
    if load and load["load_s"] is not None and state.get("load") != load:
        _write_atomically(state_path, json.dumps({"load": load}))
    _write_atomically(out_path, text)


def _write_atomically(path, text):
    """`path` replaced by `text` in one rename (a reader never sees half a file), mode 0644."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: llama_node.py CONFIG.json OUT.prom  (role llama_metrics: the node's llama_cluster_* "
                         "metrics)")
    export(sys.argv[1], sys.argv[2])
