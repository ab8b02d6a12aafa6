"""Filter of playbooks/verify.yml: how one node differs from the inventory, the other nodes and its own plan."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# Documented in its sidecar file, filter_plugins/llama_drift.yml (ansible-doc -t filter llama_drift).


def _show(text):
    """`systemctl show -p …` output as a dict (Environment kept whole)."""
    return dict(line.split("=", 1) for line in str(text).splitlines() if "=" in line)


def _held_endpoints(connections):
    """Peer addresses (host:port) of the host's established TCP connections, from `ss -Htn state established`
    (Recv-Q Send-Q Local Peer). Not by process: reading another user's sockets needs ptrace rights that a
    container's root lacks, and nothing else on the master holds a connection to a worker's RPC port."""
    return {fields[3] for fields in map(str.split, str(connections).splitlines()) if len(fields) >= 4}


def llama_drift(build, commit, protos, current, units, shows, starts, switched, cmdline="", connections=""):
    """Every way this node differs, as sentences ([] when it matches).

    build: the active BUILD-INFO.json ({} when unreadable); commit: the inventory's llamacpp_commit; protos:
    the RPC protocols of every node's active build; current: the directory current resolves to; units: the
    node's unit names; shows: for each, `systemctl show UNIT -p ActiveState -p MainPID -p Environment`; starts:
    for each, when its main process started (epoch seconds, 0 when none); switched: when current was last
    pointed somewhere (epoch seconds, the link's mtime); cmdline: llama-server's /proc/PID/cmdline
    (NUL-separated, master only); connections: `ss -Htn state
    established` (master only).
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
        argv = str(cmdline).split("\0")
        endpoints = argv[argv.index("--rpc") + 1].split(",") if "--rpc" in argv[:-1] else []
        held = _held_endpoints(connections)
        missing = [endpoint for endpoint in endpoints if endpoint not in held]
        if missing:
            problems.append(f"llama-server serves without {', '.join(missing)}: no connection, "
                            f"{len(endpoints) - len(missing)} of the {len(endpoints)} RPC workers of its plan")
    return problems


class FilterModule:
    """Drift filter."""

    def filters(self):
        return {"llama_drift": llama_drift}
