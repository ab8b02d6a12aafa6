"""Ansible filters ``llama_instances`` and ``llama_instance_shares``: several llama-server instances from one
inventory, checked before any host is changed.

An instance is one llama-server (on its master) and one RPC server on each worker it uses, with its own units and
ports. The cluster's own variables (llama_model_path on llama_master, over every worker) are the instance named
``default``, with the contract's unit names; the inventory's ``llama_instances`` adds the others. Instances that serve
the same model name are replicas of it.
"""

import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# Each filter is documented in its sidecar file, plugins/filter/<name>.yml (ansible-doc -t filter <name>).

NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")  # in unit names (llama-server-NAME.service) and metric labels
KEYS = {"name", "model_path", "model_sha256", "served_name", "master", "workers", "port", "rpc_port", "ctx_size",
        "parallel", "tensor_split", "split_strategy", "reserve_fraction"}
# What each instance inherits from the cluster's own variables when it does not set it.
INHERITED = ("ctx_size", "parallel", "tensor_split", "split_strategy", "reserve_fraction")
SERVED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/+-]{0,127}$")  # the front compares it in its configuration
OWN = "default"  # the cluster's own instance: llama_model_path on llama_master, the contract's unit names
RESERVED = {"watch": "llama-server-watch.service is the cluster's own worker watch",
            "llama-server": "the API front's name for the cluster's own llama-server"}


def _fail(message):
    raise AnsibleFilterError(message)


def _port(value, where, fix):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        _fail(f"{where} must be a TCP port (1-65535), got {value!r}: {fix}")
    return value


def _stem(path):
    """The model's name where none is given: its file name without .gguf (SmolLM2-135M-Instruct-Q8_0)."""
    return re.sub(r"\.gguf$", "", path.rstrip("/").rsplit("/", 1)[-1], flags=re.IGNORECASE)


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
    """The cluster's instances, normalised and checked: first the cluster's own (named `default`, made of `single`,
    the cluster's own variables, over every worker, with the contract's unit names), then each of the inventory's
    `llama_instances`. See the sidecar file for the fields. Every error names the instance, the variable and the
    fix."""
    hosts = hosts or {}
    if not isinstance(single, Mapping) or "model_path" not in single or "port" not in single:
        _fail("llama_instances: `single` needs at least model_path and port (the cluster's own variables)")
    if not isinstance(workers, (list, tuple)) or not workers:
        _fail("llama_instances: the inventory has no host in llama_workers: add at least one")
    workers = list(workers)
    if declared in (None, "", [], ()):
        declared = []
    elif not isinstance(declared, (list, tuple)) or not all(isinstance(item, Mapping) for item in declared):
        _fail(f"llama_instances must be a list of instances ({{name, model_path, ...}}), got {declared!r}")
    own = {"name": OWN, "model_path": single["model_path"], "model_sha256": single.get("model_sha256", ""),
           "served_name": single.get("served_name") or "", "port": int(single["port"])}
    named, found = {}, []
    for index, item in enumerate([own] + list(declared)):
        where = f"llama_instances[{index - 1}]" if index else "the cluster's own instance"
        unknown = sorted(set(item) - KEYS)
        if unknown:
            _fail(f"{where} has unknown key(s) {', '.join(unknown)}: an instance takes {', '.join(sorted(KEYS))}")
        name = item.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            _fail(f"{where}.name must be a short lower-case name (a-z, 0-9, '-', starting with a letter; it names "
                  f"the instance's units and metrics), got {name!r}")
        if name in RESERVED:
            _fail(f"{where}.name: {name!r} is taken ({RESERVED[name]}): give the instance another name")
        if name in named:
            taken = "the cluster's own instance (llama_model_path on llama_master)" if named[name] < 0 else \
                f"llama_instances[{named[name]}]"
            _fail(f"{where}: the name {name!r} is taken by {taken}: give each instance its own name")
        named[name] = index - 1
        label = f"instance {name!r} ({where})"
        model = item.get("model_path")
        if not isinstance(model, str) or not model:
            _fail(f"{label} has no model_path: set {where + '.model_path' if index else 'llama_model_path'} to the "
                  f"GGUF it serves")
        host = item.get("master", master)
        if host not in [master] + workers:
            _fail(f"{label}: master {host!r} is not a host of llama_master or llama_workers: set {where}.master "
                  f"to one of {', '.join(dict.fromkeys([master] + workers))}")
        used = _workers(item.get("workers", workers), f"{label}: {where}.workers", workers)
        port = _port(item.get("port", int(single["port"]) + index), f"{label}: {where}.port",
                     f"set {where}.port to a free port of {host}")
        for worker in used:
            rpc = int((hosts.get(worker["host"]) or {}).get("rpc_port", 50052))
            worker["rpc_port"] = rpc if not index else _port(
                item.get("rpc_port", rpc + index), f"{label}: {where}.rpc_port", f"set {where}.rpc_port to a free port")
        served = item.get("served_name") or _stem(model)
        if not isinstance(served, str) or not SERVED.match(served):
            named_by = f"{where}.served_name" if index else "llama_server_alias"
            _fail(f"{label}: the model name {served!r} (the `model` clients ask for) must be letters, digits and . _ : "
                  f"/ + - (no space): set {named_by} to such a name")
        suffix = f"-{name}" if index else ""
        instance = {"name": name, "index": index, "model_path": model, "model_sha256": item.get("model_sha256") or "",
                    "served_name": served, "master": host, "workers": used, "port": port, "default": not index,
                    "unit": f"llama-server{suffix}.service", "rpc_unit": f"llama-rpc-server{suffix}.service",
                    "where": where}
        for key in INHERITED:
            instance[key] = item.get(key, single.get(key)) if index else single.get(key)
        found.append(instance)
    _check_ports(found, hosts)
    for instance in found:
        instance["replicas"] = [other["name"] for other in found if other["served_name"] == instance["served_name"]]
        # The API front's names for it: its model's backend (the cluster's own model's is `llama_server`, as with one
        # instance; another's `llama_server_` + its first instance's name) and its server there.
        first = instance["replicas"][0]
        instance["backend"] = "llama_server" if first == OWN else f"llama_server_{first}"
        instance["server"] = "llama-server" if instance["index"] == 0 else instance["name"]
    return found


def _check_ports(instances, hosts):
    """Two users of one TCP port on one host: two instances, or another instance and a port the host uses already
    (`hosts[host].reserved`: {port: what holds it}). The cluster's own ports against the host's others are its roles'
    preflight checks, as without instances."""
    reserved = {(host, int(port)): holder for host, facts in hosts.items()
                for port, holder in ((facts or {}).get("reserved") or {}).items()}
    taken = {}
    for instance in instances:
        where = instance["where"]
        named = (f"{where}.port", f"{where}.rpc_port") if instance["index"] else \
            ("llama_server_internal_port", "llama_rpc_port")
        claims = [(instance["master"], instance["port"], named[0])]
        claims += [(worker["host"], worker["rpc_port"], named[1]) for worker in instance["workers"]]
        for host, port, variable in claims:
            holder = taken.get((host, port)) or (reserved.get((host, port)) if instance["index"] else None)
            if holder:
                _fail(f"instance {instance['name']!r}: port {port} on {host} ({variable}) is taken by {holder}: set "
                      f"{variable} to another port")
            taken[(host, port)] = f"instance {instance['name']!r} ({variable})"


def llama_instance_shares(instances, devices, shares=None):
    """What part of each device's memory each instance may plan with: {instance: {host: {device: fraction}}}.

    `devices`: {host: [device names]} (each host's devices, as llama_rpc_worker.devices lists them); None checks
    only `shares` (before the devices are known), and returns {}. `shares`:
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
    if devices is None:
        return {}
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


def llama_instance_workers(instances, host, worker=None, addresses=None):
    """The RPC servers `host` runs for the instances besides the cluster's own: [{name, unit, port, devices, master,
    server_unit}] (devices: the names it exposes to that instance, empty = all of the worker's; master: the host that
    dials it; server_unit: the llama-server unit there).
    With `worker` (the host's llama_rpc_worker), each also has `worker`: that dict as the instance sees it (its unit,
    port, endpoint and devices). With `addresses` ({host: cluster address}), each also has `peer` (its master's
    address, the only one its RPC server admits) and `rule` (the firewall's, as role llama_access lists them)."""
    found = []
    for instance in instances:
        for entry in instance["workers"] if instance["index"] else []:
            if entry["host"] != host:
                continue
            item = {"name": instance["name"], "unit": instance["rpc_unit"], "port": entry["rpc_port"],
                    "devices": entry["devices"], "master": instance["master"], "server_unit": instance["unit"]}
            if worker is not None:
                available = list(worker.get("devices") or [])
                names = [device["name"] for device in available]
                unknown = [name for name in entry["devices"] if name not in names]
                if unknown:
                    _fail(f"instance {instance['name']!r}: {host} has no device {', '.join(unknown)} "
                          f"({instance['where']}.workers; it has {', '.join(names) or 'none'})")
                address = str(worker["endpoint"]).rsplit(":", 1)[0]
                item["worker"] = dict(worker, unit=instance["rpc_unit"], port=entry["rpc_port"],
                                      endpoint=f"{address}:{entry['rpc_port']}",
                                      devices=[device for device in available
                                               if not entry["devices"] or device["name"] in entry["devices"]])
            if addresses is not None:
                item["peer"] = addresses[instance["master"]]
                item["rule"] = {"name": f"RPC {instance['name']}", "proto": "tcp", "port": entry["rpc_port"],
                                "sources": [item["peer"]]}
            found.append(item)
    return found


def llama_instance_served(parts, address, front, front_address, host):
    """One instance as its master runs it: `parts` is (the instance, its model as llama_model_store served it, its
    llama_gguf_info result, its llama_plan result). It listens on loopback on the front's host, else on the master's
    cluster address (`address`), where the front's host alone may reach it (`rule`: the firewall's)."""
    instance, served, gguf, planned = parts
    listen = "127.0.0.1" if host == front else address
    rules = [] if host == front else [{"name": f"API {instance['name']}", "proto": "tcp", "port": instance["port"],
                                       "sources": [front_address]}]
    return dict(instance, served=served, model=dict(gguf["model"], **gguf["gguf"]), devices=planned["devices"],
                rpc=planned["rpc"], plan=planned["plan"], table=planned["table"], listen=listen, rules=rules,
                url=f"http://{listen}:{instance['port']}")


def llama_front_routes(instances, host, addresses):
    """What the API front on `host` routes to: one route per served model, in instance order, the cluster's own
    first: {model, backend, servers: [{name, address, port}]}. The cluster's own model's backend is `llama_server`
    (as with one instance); another's is `llama_server_` + its first instance's name. A server's HAProxy name
    (`server`) is its instance's, `llama-server` for the cluster's own (as with one instance). An instance on `host` is
    reached on loopback, another at its master's address (`addresses`: {host: cluster address})."""
    routes = {}
    for instance in instances:
        route = routes.setdefault(instance["served_name"], {"model": instance["served_name"],
                                                            "backend": instance["backend"], "servers": []})
        address = "127.0.0.1" if instance["master"] == host else addresses[instance["master"]]
        route["servers"].append({"name": instance["name"], "address": address, "port": instance["port"],
                                 "server": instance["server"]})
    return list(routes.values())


class FilterModule:
    """Several llama-server instances from one inventory."""

    def filters(self):
        return {"llama_instances": llama_instances, "llama_instance_shares": llama_instance_shares,
                "llama_instance_workers": llama_instance_workers, "llama_instance_served": llama_instance_served,
                "llama_front_routes": llama_front_routes}
