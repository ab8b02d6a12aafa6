#!/usr/bin/python
"""Discover the devices a llama.cpp RPC server (or llama-server) on this host would use."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_device_info
short_description: Discover the compute devices llama.cpp will use on a host
description:
  - Lists the devices llama.cpp's backend exposes on this host, with total memory, in llama.cpp's naming.
  - NVIDIA GPUs through C(nvidia-smi) (named CUDA0, CUDA1, ... for the cuda backend, Vulkan0, ... for vulkan).
  - AMD GPUs through C(rocm-smi) when present, else sysfs (C(mem_info_vram_total)); named ROCm0, ... for hip.
  - Without a GPU of the backend's kind, the CPU device with the host's total memory (what the RPC server's
    CPU device reports).
  - Read-only; supports check mode.
options:
  backend:
    description: The build's backend.
    type: str
    required: true
    choices: [cpu, cuda, hip, vulkan]
author: llamacpp-rpc-cluster
"""

EXAMPLES = r"""
- name: Discover devices
  llama_device_info:
    backend: cuda
  register: devices
"""

RETURN = r"""
devices:
  description: Devices in llama.cpp's local order.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "CUDA0", "description": "NVIDIA GeForce RTX 3090", "memory_mib": 24576, "kind": "gpu"}]
"""

import glob
import os

from ansible.module_utils.basic import AnsibleModule

GPU_PREFIX = {"cuda": "CUDA", "hip": "ROCm", "vulkan": "Vulkan"}
AMD_VENDOR = "0x1002"


def nvidia_gpus(module):
    """(description, total MiB) per NVIDIA GPU, in nvidia-smi index order."""
    smi = module.get_bin_path("nvidia-smi")
    if not smi:
        return []
    rc, out, err = module.run_command(
        [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"])
    if rc != 0:
        module.fail_json(msg=f"nvidia-smi failed (rc={rc}): {err.strip() or out.strip()}")
    return parse_nvidia_smi(out)


def parse_nvidia_smi(text):
    """(description, total MiB) per GPU from `--query-gpu=index,name,memory.total --format=csv,noheader,nounits`.

    In nvidia-smi's index order, which is PCI bus order. CUDA numbers devices fastest-first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID, so the units set that variable and CUDA0 is nvidia-smi's GPU 0.
    """
    gpus = []
    for line in text.splitlines():
        if line.strip():
            index, rest = line.split(",", 1)
            name, total = rest.rsplit(",", 1)
            gpus.append((int(index), name.strip(), int(float(total))))
    return [(name, total) for _, name, total in sorted(gpus)]


def amd_gpus():
    """(description, total MiB) per AMD GPU from sysfs (what rocm-smi reads too)."""
    gpus = []
    for card in sorted(glob.glob("/sys/class/drm/card[0-9]*/device")):
        try:
            with open(os.path.join(card, "vendor")) as handle:
                if handle.read().strip() != AMD_VENDOR:
                    continue
            with open(os.path.join(card, "mem_info_vram_total")) as handle:
                total = int(handle.read().strip()) // (1024 * 1024)
        except OSError:
            continue
        gpus.append((f"AMD GPU {os.path.basename(os.path.dirname(card))}", total))
    return gpus


def host_memory_mib():
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("MemTotal missing from /proc/meminfo")


def discover(module, backend):
    gpus = []
    if backend in ("cuda", "vulkan"):
        gpus = nvidia_gpus(module)
    if backend == "hip" or (backend == "vulkan" and not gpus):
        gpus = amd_gpus()
    if gpus:
        prefix = GPU_PREFIX[backend]
        return [{"name": f"{prefix}{i}", "description": desc, "memory_mib": total, "kind": "gpu"}
                for i, (desc, total) in enumerate(gpus)]
    return [{"name": "CPU", "description": "CPU", "memory_mib": host_memory_mib(), "kind": "cpu"}]


def main():
    module = AnsibleModule(
        argument_spec={"backend": {"type": "str", "required": True, "choices": ["cpu", "cuda", "hip", "vulkan"]}},
        supports_check_mode=True,
    )
    module.exit_json(changed=False, devices=discover(module, module.params["backend"]))


if __name__ == "__main__":
    main()
