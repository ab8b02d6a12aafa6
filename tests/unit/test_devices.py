"""Device discovery parsing and llama.cpp's device order for an RPC cluster."""

import llama_device_info
import pytest
from ansible.errors import AnsibleFilterError
from llama_cluster import llama_device_order


def test_nvidia_smi_rows_in_index_order():
    text = "1, NVIDIA GeForce RTX 3060, 12288\n0, NVIDIA GeForce RTX 3090, 24576\n\n"
    assert llama_device_info.parse_nvidia_smi(text) == [("NVIDIA GeForce RTX 3090", 24576),
                                                        ("NVIDIA GeForce RTX 3060", 12288)]


def test_nvidia_smi_name_with_comma():
    assert llama_device_info.parse_nvidia_smi("0, Tesla V100-SXM2-16GB, rev, 16160.0\n") == [
        ("Tesla V100-SXM2-16GB, rev", 16160)]


def worker(name, *devices):
    return {"inventory_hostname": name, "llama_node_devices": [
        {"name": local, "memory_mib": memory, "kind": "gpu" if local != "CPU" else "cpu"} for local, memory in devices]}


def test_rpc_devices_are_numbered_globally_in_rpc_order():
    workers = [worker("a", ("CUDA0", 24576), ("CUDA1", 12288)), worker("b", ("CPU", 64000))]
    order = llama_device_order(workers, [{"name": "CUDA0", "memory_mib": 8192, "kind": "gpu"}], False, "m")
    assert [(d["name"], d["host"], d["local_name"]) for d in order] == [
        ("RPC0", "a", "CUDA0"), ("RPC1", "a", "CUDA1"), ("RPC2", "b", "CPU"), ("CUDA0", "m", "CUDA0")]
    assert all(d["speed"] == 1.0 for d in order)


def test_master_cpu_and_master_as_worker_add_no_local_devices():
    workers = [worker("m", ("CUDA0", 24576)), worker("b", ("CUDA0", 12288))]
    local = [{"name": "CUDA0", "memory_mib": 24576, "kind": "gpu"}]
    assert [d["name"] for d in llama_device_order(workers, local, True, "m")] == ["RPC0", "RPC1"]
    cpu = [{"name": "CPU", "memory_mib": 64000, "kind": "cpu"}]
    assert [d["name"] for d in llama_device_order(workers, cpu, False, "m")] == ["RPC0", "RPC1"]


def test_worker_without_devices_is_named():
    with pytest.raises(AnsibleFilterError, match="worker b has no llama_node_devices"):
        llama_device_order([worker("a", ("CPU", 1000)), {"inventory_hostname": "b"}])


def test_overridden_master_cpu_is_not_a_local_gpu():
    """llama_devices entries carry no `kind`: the master's CPU must not become a --device."""
    workers = [worker("a", ("CPU", 40))]
    local = [{"name": "CPU", "memory_mib": 40}, {"name": "CUDA0", "memory_mib": 8192}]
    assert [d["name"] for d in llama_device_order(workers, local, False, "m")] == ["RPC0", "CUDA0"]
