"""The systemd sandbox every cluster unit gets (plugins/filter/llama_unit.py)."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_unit import llama_unit_sandbox


def values(lines, key):
    return [line.split("=", 1)[1] for line in lines if line.startswith(key + "=")]


def test_cpu_closes_every_device_and_jit():
    lines = llama_unit_sandbox("cpu")
    assert "PrivateDevices=true" in lines and "MemoryDenyWriteExecute=true" in lines
    assert values(lines, "DeviceAllow") == [] and values(lines, "ProtectSystem") == ["strict"]


@pytest.mark.parametrize("backend, devices", [
    ("cuda", ["char-nvidia-frontend rw", "char-nvidia-uvm rw", "char-nvidia-caps rw"]),
    ("hip", ["/dev/kfd rw", "char-drm rw"]),
    ("vulkan", ["char-drm rw"]),
])
def test_gpu_backends_open_exactly_their_device_nodes(backend, devices):
    lines = llama_unit_sandbox(backend)
    assert values(lines, "DevicePolicy") == ["closed"]
    assert values(lines, "DeviceAllow") == devices
    # GPU runtimes JIT and read /proc/driver: those restrictions are the CPU's only.
    assert "MemoryDenyWriteExecute=true" not in lines and "PrivateDevices=true" not in lines


@pytest.mark.parametrize("backend", ["cpu", "cuda", "hip", "vulkan"])
def test_mesa_keeps_its_pipeline_cache_where_the_unit_may_write(backend):
    """Vulkan units get a cache directory of their own for Mesa's compiled pipelines (the home is read-only)."""
    lines = llama_unit_sandbox(backend)
    expected = ["MESA_SHADER_CACHE_DIR=/var/cache/llama-vulkan-shaders"] if backend == "vulkan" else []
    assert values(lines, "Environment") == expected
    assert values(lines, "CacheDirectory") == (["llama-vulkan-shaders"] if backend == "vulkan" else [])


def test_peers_deny_everyone_else():
    lines = llama_unit_sandbox("cpu", ["10.0.0.1", "192.168.1.0/24", "10.0.0.1"])
    assert values(lines, "IPAddressDeny") == ["any"]
    assert values(lines, "IPAddressAllow") == ["localhost 10.0.0.1/32 192.168.1.0/24"]


def test_no_peer_list_means_anyone():
    assert values(llama_unit_sandbox("cpu", None), "IPAddressDeny") == []
    assert values(llama_unit_sandbox("cpu", []), "IPAddressAllow") == ["localhost"]


def test_writable_paths():
    assert values(llama_unit_sandbox("cuda", None, ["/data/cache"]), "ReadWritePaths") == ["/data/cache"]


def test_bad_input_is_named():
    with pytest.raises(AnsibleFilterError, match="unknown backend 'rocm'"):
        llama_unit_sandbox("rocm")
    with pytest.raises(AnsibleFilterError, match="'master.lan' is not an IP address"):
        llama_unit_sandbox("cpu", ["master.lan"])
