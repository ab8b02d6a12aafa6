"""Filters that turn the cluster's published facts into llama.cpp's device order, --rpc list, speeds and networks."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: llama_device_order
short_description: Devices of an RPC cluster in llama.cpp's model order
description:
  - RPC devices come first, numbered RPC0, RPC1, ... globally in C(--rpc) order; a worker with several
    devices takes consecutive numbers. The master's local GPUs follow under their own names (CUDA0, ...),
    unless the master is also a worker (its devices are then reached through its RPC server).
  - Each device keeps C(memory_mib) and C(speed) (default 1.0) and gains C(host), C(local_name), C(endpoint)
    and C(worker_device).
positional: local_devices, master_is_worker, master_host
options:
  _input:
    description:
      - The workers' C(llama_rpc_worker) facts in C(--rpc) order, each C({host, endpoint, devices}); C(devices)
        is the worker's list of C({name, memory_mib, speed?, kind?}).
    type: list
    elements: dict
    required: true
  local_devices:
    description:
      - The master's own devices; only GPUs are used (C(kind) gpu, or for a C(llama_devices) entry without
        C(kind), any name but C(CPU)).
    type: list
    elements: dict
    default: []
  master_is_worker:
    description: The master also runs an RPC server.
    type: bool
    default: false
  master_host:
    description: The master's inventory name (shown as the local devices' host).
    type: str
    default: master
"""

EXAMPLES = r"""
- name: List the devices in llama.cpp's model order
  ansible.builtin.set_fact:
    llama_server_devices: >-
      {{ groups['llama_workers'] | map('extract', hostvars, 'llama_rpc_worker') | list
         | llama_device_order(__llama_local_devices, inventory_hostname in groups['llama_workers'],
                              inventory_hostname) }}
"""

RETURN = r"""
_value:
  description:
    - "Devices in model order, for example C([{name: RPC0, host: w1, local_name: CUDA0, memory_mib: 24576,
      speed: 1.0, endpoint: '10.0.0.5:50052', worker_device: 0}])."
    - C(worker_device) is the device's index on its worker, so its name is C(RPC<worker_device>) when only
      that worker is passed to C(--rpc); C(endpoint) and C(worker_device) are null for the master's own GPUs.
  type: list
  elements: dict
"""

# Documentation of the other filters, in the format of Ansible's sidecar files (filter_plugins/<name>.yml).
FILTER_DOCS = {
    "llama_rpc_endpoints": r"""
DOCUMENTATION:
  name: llama_rpc_endpoints
  short_description: The --rpc list of an RPC cluster
  description:
    - Each worker's C(endpoint), in order. Two workers on one endpoint are refused, naming both.
  options:
    _input:
      description: The workers' C(llama_rpc_worker) facts in C(--rpc) order, each C({host, endpoint, devices}).
      type: list
      elements: dict
      required: true
EXAMPLES: |
  - name: The value of llama-server's --rpc
    ansible.builtin.set_fact:
      __llama_rpc: >-
        {{ groups['llama_workers'] | map('extract', hostvars, 'llama_rpc_worker') | list
           | llama_rpc_endpoints | join(',') }}
RETURN:
  _value:
    description: Endpoints (C(address:port)) in C(--rpc) order.
    type: list
    elements: str
""",
    "llama_devices_with_speeds": r"""
DOCUMENTATION:
  name: llama_devices_with_speeds
  short_description: Give a host's devices their measured speeds
  description:
    - Each device gets the C(speed) recorded for (C(host), its C(name)) in the speeds file that
      C(playbooks/bench.yml) writes, unless it already has a C(speed) (set in C(llama_devices)).
    - Returns new dicts with every other key kept; recorded devices the host no longer has are ignored.
  positional: speeds, host
  options:
    _input:
      description: The host's devices (C(llama_devices), or discovered), each with a C(name).
      type: list
      elements: dict
      required: true
    speeds:
      description:
        - "The speeds file's content, C({host: {device name: {speed, tg_tps, ...}}, _meta: {...}}); empty or
          null when there is none."
      type: dict
      required: true
    host:
      description: The host's inventory name.
      type: str
      required: true
EXAMPLES: |
  - name: Give this host's devices their measured speeds
    ansible.builtin.set_fact:
      __llama_devices: "{{ __llama_listed_devices | llama_devices_with_speeds(__llama_speeds, inventory_hostname) }}"
RETURN:
  _value:
    description: The devices, in order, with C(speed) where one is known.
    type: list
    elements: dict
""",
    "llama_select_devices": r"""
DOCUMENTATION:
  name: llama_select_devices
  short_description: The devices a host serves (llama_rpc_devices)
  description:
    - The devices whose C(name) is in C(names), in the devices' order; all of them when C(names) is empty.
    - A name the host does not have is refused, naming the host's devices.
  positional: names, host
  options:
    _input:
      description: The host's devices (C(llama_devices), or discovered), each with a C(name).
      type: list
      elements: dict
      required: true
    names:
      description: Device names to keep (C(llama_rpc_devices)); empty keeps every device.
      type: list
      elements: str
      required: true
    host:
      description: The host's inventory name, for the error message.
      type: str
      required: true
EXAMPLES: |
  - name: Keep the devices this host serves
    ansible.builtin.set_fact:
      __llama_selected_devices: >-
        {{ __llama_listed_devices | llama_select_devices(llama_rpc_devices, inventory_hostname) }}
RETURN:
  _value:
    description: The selected devices, in order.
    type: list
    elements: dict
""",
    "llama_bench_speeds": r"""
DOCUMENTATION:
  name: llama_bench_speeds
  short_description: Relative speeds from llama-bench's token generation results
  description:
    - Reads the token generation entry (C(n_gen) > 0) of each device's C(llama-bench -o json) output.
    - C(speed) is the device's t/s over the fastest device's, rounded to 4 decimals and at least 0.0001.
    - A device whose output has no generation entry, or 0 t/s, is refused, naming the device.
  positional: devices
  options:
    _input:
      description: One llama-bench C(-o json) output per device, in the order of C(devices); JSON text or parsed.
      type: list
      elements: raw
      required: true
    devices:
      description: The measured devices, entries of C(llama_device_order) (C(name), C(host), C(local_name)).
      type: list
      elements: dict
      required: true
EXAMPLES: |
  - name: Relate each device to the fastest
    ansible.builtin.set_fact:
      __llama_bench_speeds: >-
        {{ __llama_bench_device_runs.results | map(attribute='stdout') | list
           | llama_bench_speeds(llama_server_devices) }}
RETURN:
  _value:
    description:
      - "C({host: {local_name: {speed, tg_tps, tg_tps_stddev, device}}}), the speeds file's entries; C(tg_tps) and
        C(tg_tps_stddev) are t/s rounded to 2 decimals, C(device) the name in model order (C(RPC0), ...)."
    type: dict
""",
    "llama_bench_table": r"""
DOCUMENTATION:
  name: llama_bench_table
  short_description: The measured speeds as text lines
  description:
    - A header, one row per device (t/s, its standard deviation, relative speed), and a line for the whole
      cluster when C(cluster) is given with a measured C(tg_tps).
  positional: devices, cluster
  options:
    _input:
      description: Speeds as C(llama_bench_speeds) returns them.
      type: dict
      required: true
    devices:
      description: Entries of C(llama_device_order), in the order of the rows.
      type: list
      elements: dict
      required: true
    cluster:
      description:
        - The cluster's measurement, C({devices, tensor_split, strategy, tg_tps}); no line when null or when
          C(tg_tps) is null.
      type: dict
EXAMPLES: |
  - name: Show the speeds
    ansible.builtin.debug:
      msg: "{{ __llama_bench_speeds | llama_bench_table(llama_server_devices, __llama_bench_cluster) }}"
RETURN:
  _value:
    description: Text lines.
    type: list
    elements: str
""",
    "llama_host_networks": r"""
DOCUMENTATION:
  name: llama_host_networks
  short_description: IP addresses as one-host networks
  description:
    - C(a.b.c.d/32) for an IPv4 address, C(x::y/128) for an IPv6 one; anything else is refused, naming it.
  options:
    _input:
      description: IP addresses (without a zone such as C(%eth0)).
      type: list
      elements: str
      required: true
EXAMPLES: |
  - name: Admit the master only
    ansible.builtin.set_fact:
      __llama_rpc_sources: "{{ [hostvars[groups['llama_master'][0]].llama_cluster_address] | llama_host_networks }}"
RETURN:
  _value:
    description: Networks, in order.
    type: list
    elements: str
""",
}

BENCH_HEADER = "%-7s %-24s %10s %8s %7s" % ("device", "host (device)", "tg t/s", "+/-", "speed")
BENCH_ROW = "%-7s %-24s %10.2f %8.2f %7.3f"
MIN_SPEED = 0.0001


def _is_list(value):
    return isinstance(value, (list, tuple))


def _workers(workers):
    """The llama_rpc_worker facts, checked to have a host and an endpoint."""
    if not _is_list(workers):
        raise AnsibleFilterError(f"workers must be a list of llama_rpc_worker facts, got {workers!r}")
    for index, worker in enumerate(workers):
        if not isinstance(worker, Mapping) or not all(isinstance(worker.get(key), str) and worker[key]
                                                      for key in ("host", "endpoint")):
            raise AnsibleFilterError(f"workers[{index}] must be a llama_rpc_worker fact "
                                     f"({{host, endpoint, devices}}), got {worker!r}")
    return workers


def _devices(devices, host):
    """A host's device list, checked to be dicts with a name."""
    if not _is_list(devices) or not all(isinstance(device, Mapping) and isinstance(device.get("name"), str)
                                        for device in devices):
        raise AnsibleFilterError(f"{host}: devices must be a list of {{name, memory_mib}} dicts "
                                 f"(llama_devices or discovery), got {devices!r}")
    return devices


def device_kind(device):
    """`kind` as discovered; for a `llama_devices` entry without one, llama.cpp's CPU device is named CPU."""
    return device.get("kind") or ("cpu" if device["name"].upper().startswith("CPU") else "gpu")


def _entry(device, name, host, endpoint, worker_device):
    """One device of llama_device_order's result."""
    try:
        memory_mib, speed = int(device["memory_mib"]), float(device.get("speed", 1.0))
    except (KeyError, TypeError, ValueError):
        raise AnsibleFilterError(f"{host}: device {device['name']} needs an integer memory_mib and a numeric "
                                 f"speed, got {dict(device)!r}") from None
    return {
        "name": name,
        "host": host,
        "local_name": device["name"],
        "memory_mib": memory_mib,
        "speed": speed,
        "endpoint": endpoint,
        "worker_device": worker_device,
    }


def llama_device_order(workers, local_devices=(), master_is_worker=False, master_host="master"):
    """Devices in llama.cpp's model order: the workers' as RPC0, RPC1, ..., then the master's GPUs."""
    ordered = []
    for worker in _workers(workers):
        host = worker["host"]
        devices = worker.get("devices")
        if not devices:
            raise AnsibleFilterError(f"worker {host} publishes no devices (llama_rpc_worker.devices is "
                                     f"{devices!r}): set llama_devices for it or check its device discovery")
        for index, device in enumerate(_devices(devices, host)):
            ordered.append(_entry(device, f"RPC{len(ordered)}", host, worker["endpoint"], index))
    if not master_is_worker:
        ordered += [_entry(device, device["name"], master_host, None, None)
                    for device in _devices(local_devices or (), master_host) if device_kind(device) == "gpu"]
    return ordered


def llama_rpc_endpoints(workers):
    """The --rpc list: each worker's endpoint, in order; two workers on one endpoint are refused."""
    hosts = {}
    for worker in _workers(workers):
        endpoint = worker["endpoint"]
        if endpoint in hosts:
            raise AnsibleFilterError(f"{hosts[endpoint]} and {worker['host']} both use {endpoint} "
                                     "(llama_rpc_bind_address:llama_rpc_port): give each worker its own address "
                                     "or port")
        hosts[endpoint] = worker["host"]
    return list(hosts)


def llama_devices_with_speeds(devices, speeds, host):
    """The devices with the speeds recorded for `host`, unless a device has its own speed."""
    if speeds is not None and not isinstance(speeds, Mapping):
        raise AnsibleFilterError(f"speeds must be the speeds file's dict ({{host: {{device: {{speed, ...}}}}}}), "
                                 f"got {speeds!r}")
    recorded = (speeds or {}).get(host) or {}
    if not isinstance(recorded, Mapping):
        raise AnsibleFilterError(f"{host}: the speeds file's entry for {host} must be a dict of devices, "
                                 f"got {recorded!r}")
    merged = []
    for device in _devices(devices, host):
        entry, measured = dict(device), recorded.get(device["name"])
        if entry.get("speed") is None and isinstance(measured, Mapping) and measured.get("speed") is not None:
            entry["speed"] = measured["speed"]
        merged.append(entry)
    return merged


def llama_select_devices(devices, names, host):
    """The devices named in `names` (all when it is empty), in the devices' order."""
    devices = _devices(devices, host)
    if not names:
        return list(devices)
    if not _is_list(names) or not all(isinstance(name, str) for name in names):
        raise AnsibleFilterError(f"{host}: llama_rpc_devices must be a list of device names, got {names!r}")
    available = [device["name"] for device in devices]
    unknown = [name for name in names if name not in available]
    if unknown:
        raise AnsibleFilterError(f"{host}: llama_rpc_devices names {', '.join(unknown)}, but {host} has "
                                 f"{', '.join(available) or 'no devices'} (llama_devices or discovery)")
    return [device for device in devices if device["name"] in names]


def _label(device):
    return f"{device['name']} ({device['host']} {device['local_name']})"


def _generation(output, device):
    """(avg_ts, stddev_ts) of the token generation entry of one llama-bench -o json output."""
    if isinstance(output, str):
        try:
            output = json.loads(output)
        except ValueError as err:
            raise AnsibleFilterError(f"{_label(device)}: llama-bench output is not JSON ({err})") from None
    entries = [entry for entry in output if isinstance(entry, Mapping) and (entry.get("n_gen") or 0) > 0] \
        if _is_list(output) else []
    if not entries:
        raise AnsibleFilterError(f"{_label(device)}: llama-bench output has no token generation result "
                                 "(an entry with n_gen > 0)")
    tps = float(entries[0].get("avg_ts") or 0)
    if tps <= 0:
        raise AnsibleFilterError(f"{_label(device)}: llama-bench measured {tps:g} t/s")
    return tps, float(entries[0].get("stddev_ts") or 0)


def llama_bench_speeds(outputs, devices):
    """{host: {local_name: {speed, tg_tps, tg_tps_stddev, device}}} from one llama-bench output per device."""
    if not _is_list(outputs) or not _is_list(devices):
        raise AnsibleFilterError("llama_bench_speeds needs a list of llama-bench outputs and a list of devices, got "
                                 f"{type(outputs).__name__} and {type(devices).__name__}")
    if not devices or len(outputs) != len(devices):
        raise AnsibleFilterError("llama_bench_speeds needs one llama-bench output per device, in the devices' "
                                 f"order: got {len(outputs)} outputs for {len(devices)} devices")
    measured = [_generation(output, device) for output, device in zip(outputs, devices)]
    fastest = max(tps for tps, _ in measured)
    speeds = {}
    for device, (tps, stddev) in zip(devices, measured):
        speeds.setdefault(device["host"], {})[device["local_name"]] = {
            "speed": max(round(tps / fastest, 4), MIN_SPEED),
            "tg_tps": round(tps, 2),
            "tg_tps_stddev": round(stddev, 2),
            "device": device["name"],
        }
    return speeds


def llama_bench_table(speeds, devices, cluster=None):
    """The speeds as text lines: a header, a row per device, the cluster's t/s if measured."""
    lines = [BENCH_HEADER]
    for device in devices:
        measured = (speeds.get(device["host"]) or {}).get(device["local_name"])
        if not measured:
            raise AnsibleFilterError(f"{_label(device)} has no measured speed (the speeds have hosts "
                                     f"{', '.join(sorted(speeds)) or 'none'})")
        lines.append(BENCH_ROW % (device["name"], f"{device['host']} ({device['local_name']})",
                                  measured["tg_tps"], measured["tg_tps_stddev"], measured["speed"]))
    if cluster and cluster.get("tg_tps") is not None:
        lines.append(f"cluster {','.join(cluster['devices'])} --tensor-split "
                     f"{','.join(str(value) for value in cluster['tensor_split'])} ({cluster['strategy']}): "
                     f"{float(cluster['tg_tps']):.2f} t/s")
    return lines


def llama_host_networks(addresses):
    """Each IP address as a one-host network: a.b.c.d/32, x::y/128."""
    if not _is_list(addresses):
        raise AnsibleFilterError(f"llama_host_networks needs a list of IP addresses, got {addresses!r}")
    networks = []
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address) if isinstance(address, str) else None
        except ValueError:
            ip = None
        if ip is None:
            raise AnsibleFilterError(f"llama_host_networks: {address!r} is not an IP address")
        if getattr(ip, "scope_id", None):
            raise AnsibleFilterError(f"llama_host_networks: {address!r} has a zone (%{ip.scope_id}): give the "
                                     "address without it")
        networks.append(f"{ip}/{ip.max_prefixlen}")
    return networks


class FilterModule:
    """llama.cpp cluster topology filters."""

    def filters(self):
        return {
            "llama_device_order": llama_device_order,
            "llama_rpc_endpoints": llama_rpc_endpoints,
            "llama_devices_with_speeds": llama_devices_with_speeds,
            "llama_select_devices": llama_select_devices,
            "llama_bench_speeds": llama_bench_speeds,
            "llama_bench_table": llama_bench_table,
            "llama_host_networks": llama_host_networks,
        }
