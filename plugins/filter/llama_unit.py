"""The sandbox of the cluster's systemd units: one set of directives, per backend, for every service."""

from __future__ import annotations

import ipaddress

from ansible.errors import AnsibleFilterError

# Device nodes each backend opens, as systemd device groups (/proc/devices names) or paths. Everything else
# under /dev is closed (DevicePolicy=closed still admits /dev/null, zero, full, random, urandom, tty, ptmx).
BACKEND_DEVICES = {
    "cpu": [],
    "cuda": ["char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps"],  # /dev/nvidia{0..,ctl,-uvm*,-caps}
    "hip": ["/dev/kfd", "char-drm"],  # /dev/kfd, /dev/dri/*
    "vulkan": ["char-drm"],  # /dev/dri/*
}

# On-disk caches a backend's driver keeps between runs when it may write them (ProtectHome makes the home
# read-only, so without one it compiles everything again at every start): (environment variable, directory under
# /var/cache, a CacheDirectory of the unit). Mesa's Vulkan drivers (RADV, ANV, lavapipe) compile every pipeline
# llama.cpp creates; with the cache a lavapipe llama-server was serving 8 s after its start instead of 84 s
# (docs/backends.md).
BACKEND_CACHES = {
    "vulkan": [("MESA_SHADER_CACHE_DIR", "llama-vulkan-shaders")],
}

# Directives every unit gets. Nothing here writes outside the paths the unit names, gains privileges,
# or talks anything but IP (and netlink, for the interface list).
COMMON = [
    "NoNewPrivileges=true",
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
    "ProtectSystem=strict",
    "ProtectHome=true",
    "PrivateTmp=true",
    "ProtectClock=true",
    "ProtectHostname=true",
    "ProtectKernelTunables=true",
    "ProtectKernelModules=true",
    "ProtectKernelLogs=true",
    "ProtectControlGroups=true",
    "ProtectProc=invisible",
    "RestrictNamespaces=true",
    "RestrictRealtime=true",
    "RestrictSUIDSGID=true",
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK",
    "LockPersonality=true",
    "RemoveIPC=true",
    "UMask=0077",
    "SystemCallArchitectures=native",
    "SystemCallFilter=@system-service",
    "SystemCallFilter=~@privileged",
    "SystemCallErrorNumber=EPERM",
]

# What only a CPU process can also give up: GPU runtimes read /proc/driver, JIT code (Vulkan's lavapipe,
# CUDA's PTX loader) and map device memory.
CPU_ONLY = [
    "PrivateDevices=true",
    "ProcSubset=pid",
    "MemoryDenyWriteExecute=true",
]


def _network(source):
    try:
        return str(ipaddress.ip_network(str(source), strict=False))
    except ValueError as exc:
        raise AnsibleFilterError(f"llama_unit_sandbox: '{source}' is not an IP address or network") from exc


def llama_unit_sandbox(backend, ip_allow=None, writable=None):
    """systemd [Service] directives for a cluster service running on `backend`.

    ip_allow: None = any peer; a list = only loopback and these addresses/networks (IPAddressDeny=any).
    writable: paths the service writes besides its CacheDirectory/StateDirectory (ReadWritePaths)."""
    if backend not in BACKEND_DEVICES:
        raise AnsibleFilterError(
            f"llama_unit_sandbox: unknown backend '{backend}' (one of {', '.join(BACKEND_DEVICES)})")
    lines = list(COMMON)
    if backend == "cpu":
        lines += CPU_ONLY
    else:
        lines += ["DevicePolicy=closed"] + [f"DeviceAllow={device} rw" for device in BACKEND_DEVICES[backend]]
    for variable, directory in BACKEND_CACHES.get(backend, []):
        lines += [f"CacheDirectory={directory}", f"Environment={variable}=/var/cache/{directory}"]
    if writable:
        lines.append("ReadWritePaths=" + " ".join(str(path) for path in writable))
    if ip_allow is not None:
        allowed = list(dict.fromkeys(["localhost"] + [_network(source) for source in ip_allow]))
        lines += ["IPAddressDeny=any", "IPAddressAllow=" + " ".join(allowed)]
    return lines


class FilterModule:
    def filters(self):
        return {"llama_unit_sandbox": llama_unit_sandbox}
