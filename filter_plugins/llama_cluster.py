"""Filters that turn the cluster's published facts into llama.cpp's device order, --rpc list, speeds and networks."""

from __future__ import annotations

import ipaddress
import re
import json
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# Each filter is documented in its sidecar file, filter_plugins/<name>.yml (ansible-doc -t filter <name>).

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
