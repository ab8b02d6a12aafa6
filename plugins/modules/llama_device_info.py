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
  - Vulkan, once a Vulkan build is active on the host (I(install_root)/current), by llama.cpp's own listing
    (C(llama-server --list-devices) in I(environment)), because which Vulkan devices llama.cpp uses and how it
    numbers them is its own choice (discrete and integrated GPUs by default, C(GGML_VK_VISIBLE_DEVICES) to pick
    others, such as Mesa's lavapipe). Before that, the vendor tools' view (RESULT source says which).
  - Without a GPU of the backend's kind, the CPU device with the host's total memory (what the RPC server's
    CPU device reports).
  - Read-only; supports check mode.
options:
  backend:
    description: The build's backend.
    type: str
    required: true
    choices: [cpu, cuda, hip, vulkan]
  install_root:
    description: Where the builds are installed (llamacpp_install_root); its current/ is the active build.
    type: path
    default: /opt/llama.cpp
  environment:
    description: The environment llama.cpp runs with on this host (llama_backend_environment).
    type: dict
    default: {}
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Discover devices
  llamacpp.rpc_cluster.llama_device_info:
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
offered:
  description: Every device an RPC server on this host can be given with -d (llama_rpc_devices) - the devices,
    then the CPU device.
  returned: always
  type: list
  elements: dict
source:
  description: >-
    Where the devices come from - llama.cpp (the active build's own listing), nvidia-smi, sysfs (AMD) or memory
    (the CPU device only). A Vulkan host's devices are exact only from llama.cpp.
  returned: always
  type: str
"""

import glob
import json
import os
import re

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
    return [(name, total) for _index, name, total in sorted(gpus)]


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


LISTED = re.compile(r"^\s+(\S+): (.*) \((\d+) MiB, \d+ MiB free\)\s*$")


def parse_list_devices(text):
    """(name, description, total MiB) per device of `llama-server --list-devices` (GPUs only: it leaves out
    the CPU; "(none)" when there is no GPU)."""
    return [(m.group(1), m.group(2), int(m.group(3))) for m in map(LISTED.match, text.splitlines()) if m]


def llama_cpp_devices(module, backend, install_root, environment):
    """The active build's own listing, when the active build is of this backend; else None."""
    current = os.path.join(install_root, "current")
    try:
        with open(os.path.join(current, "BUILD-INFO.json")) as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        return None
    server = os.path.join(current, "bin", "llama-server")
    if info.get("backend") != backend or not os.access(server, os.X_OK):
        return None
    env = {key: str(value) for key, value in environment.items()}
    rc, out, err = module.run_command([server, "--list-devices"], environ_update=env)
    if rc != 0:
        module.fail_json(msg=f"{server} --list-devices failed (rc={rc}): {err.strip()[-2000:] or out.strip()}")
    return parse_list_devices(out)


def discover(module, backend, install_root="/opt/llama.cpp", environment=None):
    """(devices, source): the devices llama.cpp uses by default on this host, in its local order."""
    gpus, source = [], "memory"
    if backend == "vulkan":
        listed = llama_cpp_devices(module, backend, install_root, environment or {})
        if listed is not None:
            devices = [{"name": name, "description": desc, "memory_mib": total, "kind": "gpu"}
                       for name, desc, total in listed]
            return (devices or [cpu_device()]), "llama.cpp"
    if backend in ("cuda", "vulkan"):
        gpus, source = nvidia_gpus(module), "nvidia-smi"
    if backend == "hip" or (backend == "vulkan" and not gpus):
        gpus, source = amd_gpus(), "sysfs"
    if gpus:
        prefix = GPU_PREFIX[backend]
        return [{"name": f"{prefix}{i}", "description": desc, "memory_mib": total, "kind": "gpu"}
                for i, (desc, total) in enumerate(gpus)], source
    return [cpu_device()], "memory"


def cpu_device():
    return {"name": "CPU", "description": "CPU", "memory_mib": host_memory_mib(), "kind": "cpu"}


def main():
    module = AnsibleModule(
        argument_spec={
            "backend": {"type": "str", "required": True, "choices": ["cpu", "cuda", "hip", "vulkan"]},
            "install_root": {"type": "path", "default": "/opt/llama.cpp"},
            "environment": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    devices, source = discover(module, params["backend"], params["install_root"], params["environment"])
    offered = devices + ([] if any(device["name"] == "CPU" for device in devices) else [cpu_device()])
    module.exit_json(changed=False, devices=devices, offered=offered, source=source)


if __name__ == "__main__":
    main()
