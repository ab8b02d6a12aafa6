"""Device discovery parsing (plugins/modules/llama_device_info.py)."""

import pytest

from ansible_collections.llamacpp.rpc_cluster.plugins.modules import llama_device_info


def test_nvidia_smi_rows_in_index_order():
    text = "1, NVIDIA GeForce RTX 3060, 12288\n0, NVIDIA GeForce RTX 3090, 24576\n\n"
    assert llama_device_info.parse_nvidia_smi(text) == [("NVIDIA GeForce RTX 3090", 24576),
                                                        ("NVIDIA GeForce RTX 3060", 12288)]


def test_nvidia_smi_name_with_comma():
    assert llama_device_info.parse_nvidia_smi("0, Tesla V100-SXM2-16GB, rev, 16160.0\n") == [
        ("Tesla V100-SXM2-16GB, rev", 16160)]


# `llama-server --list-devices` of the 0c1e570 Vulkan build: lavapipe (GGML_VK_VISIBLE_DEVICES=0) and a GPU.
LISTED = """ggml_vulkan: Found 1 Vulkan devices:
ggml_vulkan: 0 = llvmpipe (LLVM 15.0.6, 256 bits) (llvmpipe) | uma: 0 | fp16: 1 | bf16: 0 | fp4: 0 | warp size: 8
Available devices:
  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)
  Vulkan1: NVIDIA GeForce RTX 3090 (24576 MiB, 23000 MiB free)
"""


def test_list_devices_names_and_totals():
    assert llama_device_info.parse_list_devices(LISTED) == [
        ("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 2048), ("Vulkan1", "NVIDIA GeForce RTX 3090", 24576)]


def test_list_devices_without_a_gpu():
    assert llama_device_info.parse_list_devices("Available devices:\n  (none)\n") == []


class FakeModule:
    """What discover() calls on AnsibleModule: run_command (the listing) and get_bin_path (no vendor tools)."""

    def __init__(self, listing, rc=0):
        self.listing, self.rc, self.calls = listing, rc, []

    def run_command(self, argv, environ_update=None):
        self.calls.append((argv, environ_update))
        return self.rc, self.listing, ""

    def get_bin_path(self, name):
        return None

    def fail_json(self, msg):
        raise RuntimeError(msg)


def install(root, backend):
    current = root / "current"
    (current / "bin").mkdir(parents=True)
    (current / "BUILD-INFO.json").write_text(f'{{"backend": "{backend}"}}')
    server = current / "bin" / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)


def test_vulkan_devices_come_from_the_active_build(tmp_path):
    install(tmp_path, "vulkan")
    module = FakeModule(LISTED)
    devices, source = llama_device_info.discover(module, "vulkan", str(tmp_path), {"GGML_VK_VISIBLE_DEVICES": 0})
    assert source == "llama.cpp"
    assert [(d["name"], d["memory_mib"]) for d in devices] == [("Vulkan0", 2048), ("Vulkan1", 24576)]
    assert module.calls == [([str(tmp_path / "current" / "bin" / "llama-server"), "--list-devices"],
                             {"GGML_VK_VISIBLE_DEVICES": "0"})]


def test_vulkan_build_without_a_gpu_gives_the_cpu(tmp_path):
    install(tmp_path, "vulkan")
    devices, source = llama_device_info.discover(FakeModule("Available devices:\n  (none)\n"), "vulkan", str(tmp_path))
    assert source == "llama.cpp" and [d["name"] for d in devices] == ["CPU"]


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_another_backends_build_is_not_asked(tmp_path, backend):
    """A host whose active build is CPU (first Vulkan deploy on it, or no Vulkan at all) is not asked."""
    install(tmp_path, "cpu")
    module = FakeModule(LISTED)
    devices, source = llama_device_info.discover(module, "vulkan", str(tmp_path))
    assert module.calls == [] and source == "memory" and [d["name"] for d in devices] == ["CPU"]
    if backend == "cuda":
        assert llama_device_info.discover(module, "cuda", str(tmp_path))[1] == "memory"


def test_a_failing_listing_is_an_error(tmp_path):
    install(tmp_path, "vulkan")
    with pytest.raises(RuntimeError, match=r"llama-server --list-devices failed \(rc=1\)"):
        llama_device_info.discover(FakeModule("", rc=1), "vulkan", str(tmp_path))
