"""Ansible filters ``llama_instances`` and ``llama_instance_shares``: several llama-server instances from one
inventory (issue 44's first part: the inventory's shape, checked before any host is changed).

An instance is one llama-server (on its master) and one RPC server on each worker it uses, with its own ports. Today's
inventory, without ``llama_instances``, is one instance named ``default`` made of the cluster's own variables.
Instances that serve the same model name are replicas of it.
"""

import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# Each filter is documented in its sidecar file, plugins/filter/<name>.yml (ansible-doc -t filter <name>).

NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")  # in unit names (llama-server@NAME.service) and metric labels
KEYS = {"name", "model_path", "model_sha256", "served_name", "master", "workers", "port", "rpc_port", "ctx_size",
        "parallel", "tensor_split", "split_strategy", "reserve_fraction", "default"}
# What each instance inherits from the cluster's own variables when it does not set it.
INHERITED = ("ctx_size", "parallel", "tensor_split", "split_strategy", "reserve_fraction")


def _fail(message):
    raise AnsibleFilterError(message)


def _port(value, where, fix):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        _fail(f"{where} must be a TCP port (1-65535), got {value!r}: {fix}")
    return value


def _workers(value, where, known):
    """[{host, devices}] of an instance's `workers`: host names, or {host, devices} where it uses only some devices."""
    if not isinstance(value, (list, tuple)) or not value:
        _fail(f"{where} must list the hosts of llama_workers that the instance uses (at least one), got {value!r}")
    found = []
    for index, item in enumerate(value):
        entry = {"host": item, "devices": []} if isinstance(item, str) else item
        shaped = isinstance(entry, Mapping) and isinstance(entry.get("host"), str)
        if not shaped or set(entry) - {"host", "devices"}:
            _fail(f"{where}[{index}] must be a host name or {{host, devices}}, got {item!r}")
        devices = entry.get("devices") or []
        if not isinstance(devices, (list, tuple)) or not all(isinstance(name, str) and name for name in devices):
            _fail(f"{where}[{index}].devices must list device names (as llama_rpc_devices does), got {devices!r}")
        if entry["host"] not in known:
            _fail(f"{where}[{index}] names {entry['host']!r}, which is not in llama_workers "
                  f"({', '.join(known)}): add it there, or name one of them")
        if entry["host"] in [worker["host"] for worker in found]:
            _fail(f"{where} names {entry['host']!r} twice: one entry per host (list its devices in one)")
        found.append({"host": entry["host"], "devices": list(devices)})
    return found


def llama_instances(declared, single, master, workers, hosts=None):
    """The cluster's instances, normalised and checked: the inventory's `llama_instances`, or, where it is empty,
    one instance named `default` made of `single` (the cluster's own variables). See the sidecar file for the
    fields. Every error names the instance, the variable and the fix."""
    hosts = hosts or {}
    if not isinstance(single, Mapping) or "model_path" not in single or "port" not in single:
        _fail("llama_instances: `single` needs at least model_path and port (the cluster's own variables)")
    if not isinstance(workers, (list, tuple)) or not workers:
        _fail("llama_instances: the inventory has no host in llama_workers: add at least one")
    workers = list(workers)

    def rpc_port(host, offset):
        return int((hosts.get(host) or {}).get("rpc_port", 50052)) + offset

    if declared in (None, "", [], ()):
        declared = [{"name": "default", "model_path": single["model_path"], "workers": workers, "default": True}]
        given = False
    elif not isinstance(declared, (list, tuple)) or not all(isinstance(item, Mapping) for item in declared):
        _fail(f"llama_instances must be a list of instances ({{name, model_path, ...}}), got {declared!r}")
    else:
        given = True
    named, found = {}, []
    for index, item in enumerate(declared):
        where = f"llama_instances[{index}]" if given else "the cluster's instance"
        unknown = sorted(set(item) - KEYS)
        if unknown:
            _fail(f"{where} has unknown key(s) {', '.join(unknown)}: an instance takes {', '.join(sorted(KEYS))}")
        name = item.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            _fail(f"{where}.name must be a short lower-case name (a-z, 0-9, '-', starting with a letter; it names "
                  f"the instance's units and metrics), got {name!r}")
        if name in named:
            _fail(f"{where}: the name {name!r} is taken by llama_instances[{named[name]}]: give each instance its "
                  f"own name")
        named[name] = index
        label = f"instance {name!r} ({where})"
        model = item.get("model_path")
        if not isinstance(model, str) or not model:
            _fail(f"{label} has no model_path: set {where}.model_path to the GGUF it serves")
        host = item.get("master", master)
        if host not in [master] + workers:
            _fail(f"{label}: master {host!r} is not a host of llama_master or llama_workers: set {where}.master "
                  f"to one of {', '.join([master] + workers)}")
        used = _workers(item.get("workers", workers), f"{label}: {where}.workers", workers)
        port = _port(item.get("port", int(single["port"]) + index), f"{label}: {where}.port",
                     f"set {where}.port to a free port of {host}")
        for worker in used:
            worker["rpc_port"] = _port(item.get("rpc_port", rpc_port(worker["host"], index)),
                                       f"{label}: {where}.rpc_port", f"set {where}.rpc_port to a free port")
        # An instance's checksum is its own: the cluster's is the one instance's only where none is declared.
        checksum = item.get("model_sha256", "" if given else single.get("model_sha256", ""))
        instance = {"name": name, "model_path": model, "model_sha256": checksum,
                    "served_name": item.get("served_name") or name, "master": host, "workers": used,
                    "port": port, "default": bool(item.get("default", False)), "index": index}
        for key in INHERITED:
            instance[key] = item.get(key, single.get(key))
        if not isinstance(instance["served_name"], str):
            _fail(f"{label}: {where}.served_name must be a string (the `model` clients ask for)")
        found.append(instance)
    defaults = [instance["name"] for instance in found if instance["default"]]
    if len(defaults) > 1:
        _fail(f"llama_instances: {', '.join(map(repr, defaults))} all say default: true; only one instance answers "
              f"requests without a `model`: keep default: true on one of them")
    if not defaults:
        found[0]["default"] = True
    _check_ports(found, hosts)
    for instance in found:
        instance["replicas"] = [other["name"] for other in found if other["served_name"] == instance["served_name"]]
    return found


def _check_ports(instances, hosts):
    """Two users of one TCP port on one host: two instances, or an instance and a port the host uses already
    (`hosts[host].reserved`: {port: what holds it})."""
    taken = {}
    for host, facts in hosts.items():
        for port, holder in ((facts or {}).get("reserved") or {}).items():
            taken[(host, int(port))] = holder
    for instance in instances:
        where = f"llama_instances[{instance['index']}]"
        claims = [(instance["master"], instance["port"], f"{where}.port")]
        claims += [(worker["host"], worker["rpc_port"], f"{where}.rpc_port") for worker in instance["workers"]]
        for host, port, variable in claims:
            holder = taken.get((host, port))
            if holder:
                _fail(f"instance {instance['name']!r}: port {port} on {host} ({variable}) is taken by {holder}: set "
                      f"{variable} to another port")
            taken[(host, port)] = f"instance {instance['name']!r} ({variable})"


def llama_instance_shares(instances, devices, shares=None):
    """What part of each device's memory each instance may plan with: {instance: {host: {device: fraction}}}.

    `devices`: {host: [device names]} (each host's devices, as llama_rpc_worker.devices lists them). `shares`:
    {host: {instance: fraction}}, the hosts' `llama_instance_shares` (optional). A device used by several instances
    is split between them: by the host's shares where given, else evenly among those without one. Fails naming
    the host, the device and the instances when the shares on a device exceed 1, and an instance the shares name
    but llama_instances does not declare."""
    shares = shares or {}
    names = [instance["name"] for instance in instances]
    for host, given in shares.items():
        if not isinstance(given, Mapping):
            _fail(f"{host}: llama_instance_shares must map instance names to fractions, got {given!r}")
        for name, fraction in given.items():
            if name not in names:
                _fail(f"{host}: llama_instance_shares names the instance {name!r}, which llama_instances does not "
                      f"declare ({', '.join(names)}): name one of them, or remove it")
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
                _fail(f"{host}: llama_instance_shares[{name!r}] must be a fraction in (0, 1], got {fraction!r}")
    users = {}
    for instance in instances:
        for worker in instance["workers"]:
            available = list((devices or {}).get(worker["host"]) or [])
            unknown = [name for name in worker["devices"] if name not in available]
            if unknown:
                _fail(f"instance {instance['name']!r}: {worker['host']} has no device {', '.join(unknown)} "
                      f"(llama_instances[{instance['index']}].workers; it has {', '.join(available) or 'none'})")
            for device in worker["devices"] or available:
                users.setdefault((worker["host"], device), []).append(instance["name"])
    planned = {name: {} for name in names}
    for (host, device), using in users.items():
        given = {name: float(shares.get(host, {})[name]) for name in using if name in shares.get(host, {})}
        rest = [name for name in using if name not in given]
        left = 1.0 - sum(given.values())
        if left < -1e-9 or (rest and left <= 1e-9):
            _fail(f"{host}: device {device} is given to {', '.join(map(repr, using))} beyond its memory (their "
                  f"llama_instance_shares add up to {sum(given.values()):g}"
                  f"{', and ' + ', '.join(map(repr, rest)) + ' get nothing' if rest else ''}): lower the shares "
                  f"so they add up to at most 1, or give an instance another device")
        for name in using:
            planned[name].setdefault(host, {})[device] = given.get(name, left / len(rest) if rest else 0.0)
    return planned


class FilterModule:
    """Several llama-server instances from one inventory."""

    def filters(self):
        return {"llama_instances": llama_instances, "llama_instance_shares": llama_instance_shares}
