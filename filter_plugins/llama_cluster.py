"""Filters that turn the inventory's topology into llama.cpp's device order."""

from __future__ import annotations

DOCUMENTATION = r"""
name: llama_device_order
short_description: Devices of an RPC cluster in llama.cpp's model order
description:
  - RPC devices come first, numbered RPC0, RPC1, ... globally in C(--rpc) order; a worker with several
    devices takes consecutive numbers. The master's local GPUs follow under their own names (CUDA0, ...),
    unless the master is also a worker (its devices are then reached through its RPC server).
  - Each device keeps C(memory_mib) and C(speed) (default 1.0) and gains C(host) and C(local_name).
positional: workers, local_devices, master_is_worker, master_host
options:
  _input:
    description: hostvars of the workers in inventory (= C(--rpc)) order; each has C(llama_node_devices).
    type: list
    elements: dict
    required: true
  local_devices:
    description:
      - The master's own devices (C(llama_node_devices)); only GPUs are used (C(kind) gpu, or for a
        C(llama_devices) entry without C(kind), any name but C(CPU)).
    type: list
    elements: dict
  master_is_worker:
    description: The master also runs an RPC server.
    type: bool
  master_host:
    description: The master's inventory name (shown as the local devices' host).
    type: str
"""

EXAMPLES = r"""
devices: "{{ groups['llama_workers'] | map('extract', hostvars) | list
             | llama_device_order(llama_node_devices, inventory_hostname in groups['llama_workers']) }}"
"""

RETURN = r"""
_value:
  description: Devices in model order, e.g. [{name: RPC0, host: w1, local_name: CUDA0, memory_mib: 24576, speed: 1.0}].
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError


def llama_device_order(workers, local_devices=(), master_is_worker=False, master_host="master"):
    ordered = []
    for worker in workers:
        host = worker.get("inventory_hostname", "?")
        devices = worker.get("llama_node_devices")
        if not devices:
            raise AnsibleFilterError(
                f"llama_device_order: worker {host} has no llama_node_devices; run device discovery on it "
                "(llama devices.yml) or set llama_devices for it")
        for device in devices:
            ordered.append(_entry(device, f"RPC{len(ordered)}", host))
    if not master_is_worker:
        ordered += [_entry(device, device["name"], master_host) for device in local_devices or ()
                    if device_kind(device) == "gpu"]
    return ordered


def device_kind(device):
    """`kind` as discovered; for a `llama_devices` entry without one, llama.cpp's CPU device is named CPU."""
    return device.get("kind") or ("cpu" if device["name"].upper().startswith("CPU") else "gpu")


def _entry(device, name, host):
    return {
        "name": name,
        "host": host,
        "local_name": device["name"],
        "memory_mib": int(device["memory_mib"]),
        "speed": float(device.get("speed", 1.0)),
    }


class FilterModule:
    def filters(self):
        return {"llama_device_order": llama_device_order}
