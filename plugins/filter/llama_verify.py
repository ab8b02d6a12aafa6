"""Filters of playbooks/verify.yml and playbooks/status.yml: how one node differs from the inventory, the other nodes
and its own plan (llama_drift), and the whole cluster's state with every problem and its fix (llama_status_report,
from the module llama_node_status's reads: the same findings as verify.yml, and those only a status view has: the
clock, the RPC cache, the units besides llama.cpp's)."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# The node reader the module llama_node_status and the metrics exporter run: whether a worker is connected, and which
# endpoints the master holds, are decided there once.
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils import llama_node

# Documented in their sidecar files, plugins/filter/llama_drift.yml and llama_status_report.yml (ansible-doc -t filter).


def _show(text):
    """`systemctl show -p …` output as a dict (Environment kept whole)."""
    return dict(line.split("=", 1) for line in str(text).splitlines() if "=" in line)


def llama_drift(build, commit, protos, current, units, shows, starts, switched, cmdline="", connections=""):
    """Every way this node differs, as sentences ([] when it matches).

    build: the active BUILD-INFO.json ({} when unreadable); commit: the inventory's llamacpp_commit; protos:
    the RPC protocols of every node's active build; current: the directory current resolves to; units: the
    node's unit names; shows: for each, `systemctl show UNIT -p ActiveState -p MainPID -p Environment`; starts:
    for each, when its main process started (epoch seconds, 0 when none); switched: when current was last
    pointed somewhere (epoch seconds, the link's mtime); cmdline: llama-server's command line (a list, or
    /proc/PID/cmdline NUL-separated; master only); connections: the established TCP connections ([local, peer]
    pairs, or `ss -Htn state established`; master only).
    """
    if not isinstance(build, Mapping) or not all(isinstance(x, (list, tuple)) for x in (units, shows, starts)) \
            or not len(units) == len(shows) == len(starts):
        raise AnsibleFilterError(f"llama_drift needs a BUILD-INFO dict and one show and start per unit, got "
                                 f"{build!r}, {units!r}, {shows!r}, {starts!r}")
    units = [{"name": name, "show": show, "start": int(start or 0)} for name, show, start in zip(units, shows, starts)]
    problems = []
    if not build:
        problems.append(f"no readable active build ({current or 'current'}/BUILD-INFO.json)")
    else:
        if build.get("commit") != commit:
            problems.append(f"runs commit {build.get('commit')}, not llamacpp_commit {commit}")
        others = sorted({str(proto) for proto in protos if proto and proto != build.get("rpc_proto")})
        if others:
            problems.append(f"speaks RPC protocol {build.get('rpc_proto')}, other nodes {', '.join(others)}")
    for unit in units:
        show = _show(unit.get("show", ""))
        name = unit["name"]
        running = re.search(r"(?:^|\s)LLAMACPP_BUILD_ID=(\S+)", show.get("Environment", ""))
        if show.get("ActiveState") != "active":
            problems.append(f"{name} is {show.get('ActiveState', 'unknown')}, not active")
        elif build and (not running or running.group(1) != build.get("build_id")):
            problems.append(f"{name} is set up for {running.group(1) if running else 'an unknown build'}, not the "
                            f"active build {build.get('build_id')}")
        elif unit["start"] + 1 < int(switched or 0):
            problems.append(f"{name} was started before current was switched to {current or 'its build'}: it still "
                            f"runs the build before (restart it)")
    if cmdline:
        argv = [str(arg) for arg in cmdline] if isinstance(cmdline, (list, tuple)) else str(cmdline).split("\0")
        pairs = connections if isinstance(connections, (list, tuple)) else llama_node.parse_connections(connections)
        endpoints, missing = llama_node.missing_endpoints(argv, pairs)
        if missing:
            problems.append(f"llama-server serves without {', '.join(missing)}: no connection, so on fewer devices "
                            f"than planned ({len(endpoints) - len(missing)} of the {len(endpoints)} RPC workers of "
                            f"its plan)")
    return problems


MIB = 1024 * 1024
GIB = 1024 * MIB


def _llama_unit(name):
    """A unit that runs a llama.cpp build: the cluster's own llama-server or RPC server, or another instance's
    (llama_instances: llama-server-NAME and llama-rpc-server-NAME, checked like the cluster's own)."""
    return bool(llama_node.unit_instance(name))


DRIFT_FIX = "site.yml puts a node back on the inventory's build (upgrade.yml when the commit differs)"


def _size(value):
    if value is None:
        return "?"
    return f"{value / GIB:.1f} GiB" if value >= GIB else f"{value / MIB:.0f} MiB"


def _ago(since, now):
    if not since:
        return "never"
    seconds = max(0, int(now - since))
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length}{unit}"
    return f"{seconds}s"


def _span(first, end, n_layer):
    last = end - 1
    text = f"{first}-{last}" if last > first else f"{first}"
    return text + ("+out" if n_layer is not None and last == n_layer else "")


def _check_node(node):
    if not isinstance(node, Mapping) or not isinstance(node.get("status"), Mapping) or not node.get("host") \
            or not (node["status"] or node.get("unreachable")):
        raise AnsibleFilterError(f"llama_status_report: each node needs host and status (llama_node_status's "
                                 f"result), got {node!r}")


def _drift(node, protos, cmdline_host):
    status = node["status"]
    units = [unit for unit in status["units"] if _llama_unit(unit["name"])]
    return llama_drift(status["build"] or {}, node.get("commit"), protos, status.get("current", ""),
                       [unit["name"] for unit in units], [unit.get("show", "") for unit in units],
                       [unit.get("started", 0) for unit in units], status.get("switched", 0),
                       (status.get("cmdline") or []) if cmdline_host else "",
                       (status.get("connections") or []) if cmdline_host else "")


def _name_workers(problem, nodes):
    """The RPC endpoints of a finding named by their workers' inventory names where the endpoint is a worker's cluster
    address and RPC port (a TLS client endpoint on the master's loopback stays as it is)."""
    at = {f"{node.get('address')}:{node.get('rpc_port')}": node["host"] for node in nodes
          if node.get("worker") and node.get("address")}
    return re.sub(r"\b[\d.]+:\d+\b", lambda found: f"{at[found.group(0)]} ({found.group(0)})"
                  if found.group(0) in at else found.group(0), problem)


def _drift_fix(problem):
    """What to do about one of llama_drift's findings."""
    stopped = re.match(r"(\S+) is (\S+), not active", problem)
    if stopped:
        return (f"journalctl -u {stopped.group(1)} says why it is {stopped.group(2)}; systemd restarts it on a "
                f"crash, site.yml starts it")
    if problem.startswith("llama-server serves without"):
        return ("start the missing RPC servers: the master's worker watch then restarts llama-server onto every "
                "worker of its plan (else site.yml --tags workers,master)")
    return DRIFT_FIX


def _connected(node, master):
    """Whether the master holds a connection to this worker's RPC port (seen from the worker)."""
    if master is None:
        return None
    endpoint = f"{node.get('address')}:{node.get('rpc_port')}"
    return llama_node.worker_connected(node["status"].get("connections"), endpoint, master.get("address"))


def llama_status_report(nodes, max_clock_offset=1.0, cache_warn_fraction=0.9, now=None):
    """The cluster's state: {healthy, problems, nodes, table}. See plugins/filter/llama_status_report.yml."""
    if not isinstance(nodes, (list, tuple)) or not nodes:
        raise AnsibleFilterError(f"llama_status_report needs a non-empty list of nodes, got {nodes!r}")
    for node in nodes:
        _check_node(node)
    now = time.time() if now is None else now
    master = next((node for node in nodes if node.get("master")), None)
    record = (master or {}).get("status", {}).get("plan") or {}
    plan = record.get("plan") or {}
    hosts = record.get("hosts") or {}
    n_layer = (record.get("model") or {}).get("n_layer")
    commit = next((node.get("commit") for node in nodes if node.get("commit")), None)
    protos = [node["status"]["build"].get("rpc_proto") for node in nodes
              if (node["status"].get("build") or {}).get("commit") == commit]
    # What llama.cpp loaded, per device (the master's llama-server's load log): {name: {layers_loaded, loaded_bytes}}.
    loaded = {name: {"layers_loaded": device.get("layers"), "loaded_bytes": device.get("model_bytes")}
              for name, device in ((master or {}).get("status", {}).get("loaded") or {}).items()}
    problems, rows = [], []
    for node in nodes:
        status, host = node["status"], node["host"]
        if node.get("unreachable") or not status:
            problems.append(f"{host}: unreachable (fix: check the host is up and that the controller reaches it: "
                            f"ansible {host} -m ansible.builtin.ping)")
            rows.append({"host": host, "role": "+".join(role for role in ("master", "worker") if node.get(role)),
                         "address": node.get("address", ""), "unreachable": True, "build": {}, "units": [],
                         "devices": [], "memory": None, "gpus": [], "connected": None, "cache": None,
                         "clock_offset_s": None, "front": None, "health": {}})
            continue
        build = status.get("build") or {}
        for problem in _drift(node, protos, node.get("master")):
            problems.append(f"{host}: {_name_workers(problem, nodes)} (fix: {_drift_fix(problem)})")
        for unit in status.get("units") or []:
            if not _llama_unit(unit["name"]) and unit.get("load_state") != "not-found" \
                    and unit.get("active_state") != "active":
                problems.append(f"{host}: {unit['name']} is {unit.get('active_state')} (fix: systemctl status "
                                f"{unit['name']} and journalctl -u {unit['name']} say why; site.yml starts it)")
        clock = status.get("clock")
        if clock and abs(clock["offset_s"]) > max_clock_offset:
            problems.append(f"{host}: clock offset {clock['offset_s']:+.3f} s, over llama_status_max_clock_offset "
                            f"({max_clock_offset} s) (fix: chronyc sources names the time sources it cannot reach)")
        cache, cap = status.get("cache"), int(node.get("cache_max_mib") or 0) * MIB
        if cache and cap and cache["bytes"] >= cache_warn_fraction * cap:
            problems.append(f"{host}: RPC tensor cache {_size(cache['bytes'])} of its {_size(cap)} cap "
                            f"(llama_rpc_cache_max_mib) (fix: raise the cap, or run site.yml -e "
                            f"llama_rpc_cache_prune=true to drop the tensors of models no longer served)")
        devices = [{"name": name, "layers": _span(first, end, n_layer), "planned_layers": end - first,
                    "planned_bytes": size, **loaded.get(name, {"layers_loaded": None, "loaded_bytes": None})}
                   for name, (first, end), size in zip(plan.get("devices") or [], plan.get("layers") or [],
                                                       plan.get("bytes") or [])
                   if hosts.get(name) == host]
        problems += _health_problems(host, status.get("health") or {}, (status.get("front") or {}).get("held", 0))
        for device in devices:
            if device["layers_loaded"] is not None and device["layers_loaded"] != device["planned_layers"]:
                problems.append(f"{host}: llama.cpp placed {device['layers_loaded']} layers on {device['name']}, the "
                                f"plan {device['planned_layers']} (fix: the plan's device order is not llama.cpp's: "
                                f"report it with llama-server's load log, journalctl -u llama-server -g 'device')")
        units = [{"name": unit["name"], "state": unit.get("active_state"), "since": unit.get("since", 0),
                  "restarts": unit.get("restarts", 0), "memory_bytes": unit.get("memory_bytes")}
                 for unit in status.get("units") or [] if unit.get("load_state") != "not-found"]
        rows.append({
            "host": host,
            "role": "+".join(role for role in ("master", "worker") if node.get(role)),
            "address": node.get("address", ""),
            "build": {key: build.get(key) for key in ("commit", "backend", "rpc_proto", "build_id")},
            "units": units,
            "devices": devices,
            "memory": status.get("memory"),
            "gpus": status.get("gpus") or [],
            "connected": _connected(node, master) if node.get("worker") and not node.get("master") else None,
            "cache": dict(cache, cap_bytes=cap) if cache else None,
            "clock_offset_s": clock["offset_s"] if clock else None,
            "front": status.get("front"),
            "health": status.get("health") or {},
        })
    model = dict(record.get("model") or {})
    if model and master:
        model["load_s"] = master.get("status", {}).get("load_s")
    report = {"healthy": not problems, "problems": problems, "nodes": rows, "model": model}
    report["table"] = llama_status_table(report, now)
    report["text"] = "\n".join(report["table"])
    return report


def _answer(answer):
    """What a /health probe got, in words: 200, 503 (Loading model), no answer (Connection refused)."""
    status = answer.get("status")
    said = f" ({answer['error']})" if answer.get("error") else ""
    return f"{status}{said}" if status is not None else f"no answer{said}"


def _health_problems(host, health, held):
    """The master's findings from llama-server's /health, asked directly (server) and through the front (front), and
    from the requests the front holds: which of the two does not serve, and what to do."""
    server, front = health.get("server"), health.get("front")
    problems = []
    if server and server.get("status") != 200:
        behind = ", and the front holds the API's requests" if front else ""
        problems.append(f"{host}: llama-server does not serve: its /health answered {_answer(server)} at "
                        f"{server['url']}{behind} (fix: journalctl -u llama-server.service says why: a model that "
                        f"does not load, a worker that does not answer; a restart counter that keeps rising is a "
                        f"crash loop)")
    elif front and front.get("status") != 200:
        problems.append(f"{host}: the API front does not pass /health: it answered {_answer(front)} at {front['url']} "
                        f"while llama-server answers 200 directly (fix: systemctl status llama-front.service and "
                        f"journalctl -u llama-front.service say why; site.yml --tags master starts it)")
    if held and not problems:
        problems.append(f"{host}: the API front holds {held} request(s) (fix: llama-server is not serving them; "
                        f"journalctl -u llama-server.service)")
    return problems


def _columns(rows):
    widths = [max(len(str(row[column])) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def llama_status_table(report, now=None):
    """The report as lines: the nodes, their units, the devices of the plan, the model, the front, the verdict."""
    now = time.time() if now is None else now
    nodes = [("host", "role", "address", "build", "RAM used/total", "clock", "master holds it", "RPC cache")]
    units = [("host", "unit", "instance", "state", "for", "restarts", "memory")]
    devices = [("device", "host", "layers planned", "loaded", "bytes planned", "weights loaded",
                "its RPC server holds")]
    for node in report["nodes"]:
        if node.get("unreachable"):
            nodes.append((node["host"], node["role"], node["address"] or "?", "unreachable", "", "", "", ""))
            continue
        build = node["build"]
        memory = node.get("memory") or {}
        cache = node["cache"]
        nodes.append((
            node["host"], node["role"], node["address"] or "?",
            f"{build['commit'][:7]} {build.get('backend')} rpc {build.get('rpc_proto')}" if build.get("commit")
            else "none",
            f"{_size(memory['total_bytes'] - memory['available_bytes'])}/{_size(memory['total_bytes'])}"
            if memory.get("total_bytes") else "?",
            f"{node['clock_offset_s'] * 1000:+.2f} ms" if node["clock_offset_s"] is not None else "-",
            {None: "-", True: "yes", False: "NO"}[node["connected"]],
            (f"{_size(cache['bytes'])}/{_size(cache['cap_bytes'])}" if cache["cap_bytes"] else _size(cache["bytes"]))
            if cache else "-"))
        for unit in node["units"]:
            units.append((node["host"], unit["name"].removesuffix(".service"),
                          llama_node.unit_instance(unit["name"]).get("llama_instance", ""), unit["state"],
                          _ago(unit["since"], now), unit["restarts"], _size(unit["memory_bytes"])))
        held = next((unit["memory_bytes"] for unit in node["units"] if unit["name"] == "llama-rpc-server.service"),
                    None)
        for device in node["devices"]:
            devices.append((device["name"], node["host"], device["layers"],
                            "?" if device.get("layers_loaded") is None else device["layers_loaded"],
                            _size(device["planned_bytes"]), _size(device.get("loaded_bytes")), _size(held)))
        for gpu in node["gpus"]:
            units.append((node["host"], f"GPU{gpu['index']} {gpu['name']}", "", "", "", "",
                          f"{gpu['used_mib']}/{gpu['total_mib']} MiB"))
    lines = _columns(nodes) + [""] + _columns(units)
    if len(devices) > 1:
        lines += [""] + _columns(devices)
        if any("?" in (row[3], row[5]) for row in devices[1:]):
            lines.append("(loaded ?: llama-server's log does not say; llama_server_log_verbosity 4 logs the weights, "
                         "5 the layers too)")
    model = report.get("model") or {}
    if model:
        lines += ["", f"model: {model.get('source')}, sha256 {(model.get('sha256') or '?')[:12]}, {model.get('mode')} "
                      f"mode, read from {model.get('path')}"
                      + (f", loaded in {model['load_s']:.1f} s" if model.get("load_s") is not None else "")]
    for node in report["nodes"]:
        if node.get("front"):
            lines.append(f"front on {node['host']}: {node['front']['held']} requests held, "
                         f"{node['front']['sessions']} client connections")
        for path, answer in sorted((node.get("health") or {}).items()):
            lines.append(f"/health {'directly' if path == 'server' else 'through the front'} on {node['host']}: "
                         f"{_answer(answer)}")
    lines.append("healthy" if report["healthy"] else f"UNHEALTHY: {len(report['problems'])} problem(s)")
    lines.extend(f"- {problem}" for problem in report["problems"])
    return lines


class FilterModule:
    """Drift and status filters."""

    def filters(self):
        return {"llama_drift": llama_drift, "llama_status_report": llama_status_report}
