"""Filters that turn the workers' published facts into llama.cpp's device order, its --rpc list, and the devices an
RPC server exposes, with their measured speeds (roles llama_server and llama_rpc, playbooks/tasks/devices.yml)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# Each filter is documented in its sidecar file, plugins/filter/<name>.yml (ansible-doc -t filter <name>).


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


def llama_select_devices(devices, names, host, provisional=""):
    """The devices named in `names` (all when it is empty), in the devices' order.

    provisional: a device name prefix (e.g. "Vulkan") whose devices the host cannot list yet (only its first
    build of that backend can): such a name stands for a device of unknown size, marked provisional, which
    playbooks/build.yml resolves once the build is installed."""
    devices = _devices(devices, host)
    if not names:
        return list(devices)
    if not _is_list(names) or not all(isinstance(name, str) for name in names):
        raise AnsibleFilterError(f"{host}: llama_rpc_devices must be a list of device names, got {names!r}")
    available = [device["name"] for device in devices]
    pending = [name for name in names if name not in available and provisional
               and re.fullmatch(re.escape(provisional) + r"[0-9]+", name)]
    unknown = [name for name in names if name not in available and name not in pending]
    if unknown:
        raise AnsibleFilterError(f"{host}: llama_rpc_devices names {', '.join(unknown)}, but {host} has "
                                 f"{', '.join(available) or 'no devices'} (llama_devices or discovery)")
    cpu = next((device for device in devices if device["name"] == "CPU"), {"memory_mib": 1})
    return ([{"name": name, "memory_mib": cpu["memory_mib"], "provisional": True} for name in sorted(pending)]
            + [device for device in devices if device["name"] in names])


class FilterModule:
    """Device filters."""

    def filters(self):
        return {
            "llama_device_order": llama_device_order,
            "llama_rpc_endpoints": llama_rpc_endpoints,
            "llama_devices_with_speeds": llama_devices_with_speeds,
            "llama_select_devices": llama_select_devices,
        }
