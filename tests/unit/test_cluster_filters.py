"""The device filters (device order, --rpc list, speeds), the bench filters and llama_host_networks."""

import copy
import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llamacpp.rpc_cluster.plugins.filter import llama_calibrate
from ansible_collections.llamacpp.rpc_cluster.plugins.filter import llama_devices
from ansible_collections.llamacpp.rpc_cluster.plugins.filter import llama_host
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_calibrate import llama_calibrate_speeds, llama_calibrate_table
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_devices import llama_device_order, llama_devices_with_speeds, llama_rpc_endpoints, llama_select_devices
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_host import llama_host_networks


def worker(host, endpoint, *devices):
    """A llama_rpc_worker fact."""
    return {"host": host, "endpoint": endpoint,
            "devices": [{"name": local, "memory_mib": memory, "kind": "cpu" if local == "CPU" else "gpu"}
                        for local, memory in devices]}


A = worker("a", "10.0.0.1:50052", ("CUDA0", 24576), ("CUDA1", 12288))
B = worker("b", "10.0.0.2:50052", ("CPU", 64000))
MASTER_GPU = [{"name": "CUDA0", "memory_mib": 8192, "kind": "gpu"}]


def test_rpc_devices_are_numbered_globally_in_rpc_order():
    order = llama_device_order([A, B], MASTER_GPU, False, "m")
    assert order == [
        {"name": "RPC0", "host": "a", "local_name": "CUDA0", "memory_mib": 24576, "speed": 1.0,
         "endpoint": "10.0.0.1:50052", "worker_device": 0},
        {"name": "RPC1", "host": "a", "local_name": "CUDA1", "memory_mib": 12288, "speed": 1.0,
         "endpoint": "10.0.0.1:50052", "worker_device": 1},
        {"name": "RPC2", "host": "b", "local_name": "CPU", "memory_mib": 64000, "speed": 1.0,
         "endpoint": "10.0.0.2:50052", "worker_device": 0},
        {"name": "CUDA0", "host": "m", "local_name": "CUDA0", "memory_mib": 8192, "speed": 1.0,
         "endpoint": None, "worker_device": None},
    ]


def test_worker_device_is_the_rpc_name_with_only_that_worker():
    alone = llama_device_order([B, A])
    assert [(d["name"], d["worker_device"]) for d in alone] == [("RPC0", 0), ("RPC1", 0), ("RPC2", 1)]
    for device in alone:
        by_itself = llama_device_order([w for w in (A, B) if w["endpoint"] == device["endpoint"]])
        assert by_itself[device["worker_device"]]["local_name"] == device["local_name"]
        assert by_itself[device["worker_device"]]["name"] == f"RPC{device['worker_device']}"


def test_speeds_and_ansible_style_numbers_are_kept():
    fast = {"host": "a", "endpoint": "10.0.0.1:50052",
            "devices": [{"name": "CUDA0", "memory_mib": "24576", "speed": 2}, {"name": "CUDA1", "memory_mib": 8192.0}]}
    order = llama_device_order([fast])
    assert [(d["memory_mib"], d["speed"]) for d in order] == [(24576, 2.0), (8192, 1.0)]
    assert isinstance(order[0]["memory_mib"], int) and isinstance(order[0]["speed"], float)


def test_master_cpu_and_master_as_worker_add_no_local_devices():
    local = [{"name": "CUDA0", "memory_mib": 24576, "kind": "gpu"}]
    assert [d["name"] for d in llama_device_order([A, B], local, True, "m")] == ["RPC0", "RPC1", "RPC2"]
    cpu = [{"name": "CPU", "memory_mib": 64000, "kind": "cpu"}]
    assert [d["name"] for d in llama_device_order([B], cpu, False, "m")] == ["RPC0"]


def test_overridden_master_cpu_is_not_a_local_gpu():
    """llama_devices entries carry no `kind`: the master's CPU must not become a --device."""
    local = [{"name": "CPU", "memory_mib": 40}, {"name": "CUDA0", "memory_mib": 8192}]
    assert [d["name"] for d in llama_device_order([B], local, False, "m")] == ["RPC0", "CUDA0"]


@pytest.mark.parametrize("devices", [[], None])
def test_worker_without_devices_is_named(devices):
    with pytest.raises(AnsibleFilterError, match="^worker b publishes no devices"):
        llama_device_order([A, dict(B, devices=devices)])


@pytest.mark.parametrize("workers, message", [
    ("a", "^workers must be a list of llama_rpc_worker facts, got 'a'"),
    ([A, {"host": "b"}], r"^workers\[1\] must be a llama_rpc_worker fact \(\{host, endpoint, devices\}\)"),
    ([{"host": "", "endpoint": "x:1", "devices": []}], r"^workers\[0\] must be"),
    ([dict(B, devices="CPU")], r"^b: devices must be a list of \{name, memory_mib\} dicts"),
    ([dict(B, devices=[{"name": "CPU"}])], r"^b: device CPU needs an integer memory_mib and a numeric speed"),
    ([dict(B, devices=[{"name": "CPU", "memory_mib": "64G"}])], "^b: device CPU needs an integer memory_mib"),
])
def test_malformed_worker_facts_are_named(workers, message):
    with pytest.raises(AnsibleFilterError, match=message):
        llama_device_order(workers)


def test_rpc_endpoints_in_order():
    assert llama_rpc_endpoints([B, A]) == ["10.0.0.2:50052", "10.0.0.1:50052"]
    assert llama_rpc_endpoints([]) == []


def test_two_workers_on_one_endpoint_are_named():
    w1 = worker("worker1", "10.0.0.5:50052", ("CPU", 1))
    w2 = worker("worker2", "10.0.0.6:50052", ("CPU", 1))
    w3 = worker("worker3", "10.0.0.5:50052", ("CPU", 1))
    with pytest.raises(AnsibleFilterError) as err:
        llama_rpc_endpoints([w1, w2, w3])
    assert str(err.value) == ("worker1 and worker3 both use 10.0.0.5:50052 (llama_rpc_bind_address:llama_rpc_port): "
                              "give each worker its own address or port")


def test_the_same_address_on_other_ports_is_fine():
    assert llama_rpc_endpoints([worker("w1", "10.0.0.5:50052", ("CPU", 1)),
                                worker("w2", "10.0.0.5:50053", ("CPU", 1))]) == [
        "10.0.0.5:50052", "10.0.0.5:50053"]


DISCOVERED = [{"name": "CUDA0", "memory_mib": 24576, "kind": "gpu", "description": "RTX 3090"},
              {"name": "CUDA1", "memory_mib": 12288, "kind": "gpu", "description": "RTX 3060"}]
SPEEDS = {"w1": {"CUDA0": {"speed": 1.0, "tg_tps": 90.5, "device": "RPC0"},
                 "CUDA1": {"speed": 0.4, "tg_tps": 36.2, "device": "RPC1"},
                 "CUDA7": {"speed": 0.1, "tg_tps": 9.0, "device": "RPC2"}},
          "w2": {"CPU": {"speed": 0.05}},
          "_meta": {"commit": "0" * 40}}


def test_recorded_speeds_are_merged_by_host_and_name():
    before = copy.deepcopy(DISCOVERED)
    merged = llama_devices_with_speeds(DISCOVERED, SPEEDS, "w1")
    assert merged == [dict(DISCOVERED[0], speed=1.0), dict(DISCOVERED[1], speed=0.4)]
    assert DISCOVERED == before and merged[0] is not DISCOVERED[0]


def test_an_explicit_speed_wins_over_the_recorded_one():
    devices = [{"name": "CUDA0", "memory_mib": 24576, "speed": 3.0}, {"name": "CUDA1", "memory_mib": 12288}]
    assert [d.get("speed") for d in llama_devices_with_speeds(devices, SPEEDS, "w1")] == [3.0, 0.4]


@pytest.mark.parametrize("speeds, host", [({}, "w1"), (None, "w1"), (SPEEDS, "w3"), ({"w1": {"CUDA0": {}}}, "w1")])
def test_no_recorded_speed_leaves_the_devices_as_they_are(speeds, host):
    merged = llama_devices_with_speeds(DISCOVERED, speeds, host)
    assert merged == DISCOVERED and all(a is not b for a, b in zip(merged, DISCOVERED))


@pytest.mark.parametrize("speeds, message", [
    ([1], r"^speeds must be the speeds file's dict \(\{host: \{device: \{speed, \.\.\.\}\}\}\), got \[1\]"),
    ({"w1": [1]}, r"^w1: the speeds file's entry for w1 must be a dict of devices, got \[1\]"),
])
def test_malformed_speeds_are_refused(speeds, message):
    with pytest.raises(AnsibleFilterError, match=message):
        llama_devices_with_speeds(DISCOVERED, speeds, "w1")


@pytest.mark.parametrize("names, expected", [
    ([], ["CUDA0", "CUDA1"]),
    (None, ["CUDA0", "CUDA1"]),
    (["CUDA1"], ["CUDA1"]),
    (["CUDA1", "CUDA0"], ["CUDA0", "CUDA1"]),
])
def test_selected_devices_keep_the_devices_order(names, expected):
    assert [d["name"] for d in llama_select_devices(DISCOVERED, names, "w1")] == expected


def test_unknown_device_names_are_named_with_what_the_host_has():
    with pytest.raises(AnsibleFilterError) as err:
        llama_select_devices(DISCOVERED, ["CUDA0", "CUDA3"], "w1")
    assert str(err.value) == "w1: llama_rpc_devices names CUDA3, but w1 has CUDA0, CUDA1 (llama_devices or discovery)"


@pytest.mark.parametrize("devices, names, message", [
    (DISCOVERED, "CUDA0", "^w1: llama_rpc_devices must be a list of device names, got 'CUDA0'"),
    ([{"memory_mib": 1}], ["CUDA0"], r"^w1: devices must be a list of \{name, memory_mib\} dicts"),
])
def test_select_devices_refuses_malformed_input(devices, names, message):
    with pytest.raises(AnsibleFilterError, match=message):
        llama_select_devices(devices, names, "w1")


BENCH_DEVICES = llama_device_order([A, B], MASTER_GPU, False, "m")


def bench_output(tps, stddev=1.0, as_text=True):
    """A llama-bench -o json result: a prompt processing entry, then token generation."""
    entries = [{"n_prompt": 512, "n_gen": 0, "avg_ts": 5000.0, "stddev_ts": 10.0},
               {"n_prompt": 0, "n_gen": 128, "avg_ts": tps, "stddev_ts": stddev}]
    return json.dumps(entries) if as_text else entries


def test_bench_speeds_relate_each_device_to_the_fastest():
    outputs = [bench_output(100.0, 2.345), bench_output(40.004, as_text=False), bench_output(0.001),
               bench_output(66.666666, 0.5)]
    assert llama_calibrate_speeds(outputs, BENCH_DEVICES) == {
        "a": {"CUDA0": {"speed": 1.0, "tg_tps": 100.0, "tg_tps_stddev": 2.35, "device": "RPC0"},
              "CUDA1": {"speed": 0.4, "tg_tps": 40.0, "tg_tps_stddev": 1.0, "device": "RPC1"}},
        "b": {"CPU": {"speed": 0.0001, "tg_tps": 0.0, "tg_tps_stddev": 1.0, "device": "RPC2"}},
        "m": {"CUDA0": {"speed": 0.6667, "tg_tps": 66.67, "tg_tps_stddev": 0.5, "device": "CUDA0"}},
    }


@pytest.mark.parametrize("output, message", [
    (json.dumps([{"n_prompt": 512, "n_gen": 0, "avg_ts": 5000.0}]),
     r"output has no token generation result \(an entry with n_gen > 0\)$"),
    ("[]", "output has no token generation result"),
    ({"n_gen": 128, "avg_ts": 5.0}, "output has no token generation result"),
    (bench_output(0.0), "measured 0 t/s"),
    ("llama-bench: error", "output is not JSON"),
])
def test_bench_output_without_generation_names_the_device(output, message):
    outputs = [bench_output(10.0), output, bench_output(10.0), bench_output(10.0)]
    with pytest.raises(AnsibleFilterError, match=rf"^RPC1 \(a CUDA1\): llama-bench {message}"):
        llama_calibrate_speeds(outputs, BENCH_DEVICES)


@pytest.mark.parametrize("outputs, devices, message", [
    ([bench_output(1.0)], BENCH_DEVICES, "got 1 outputs for 4 devices"),
    ([], [], "got 0 outputs for 0 devices"),
    ("[]", BENCH_DEVICES, "a list of llama-bench outputs and a list of devices, got str and list"),
])
def test_bench_speeds_need_one_output_per_device(outputs, devices, message):
    with pytest.raises(AnsibleFilterError, match=f"^llama_calibrate_speeds needs .*{message}"):
        llama_calibrate_speeds(outputs, devices)


def test_bench_table_lines():
    speeds = llama_calibrate_speeds([bench_output(100.0, 2.345), bench_output(40.0), bench_output(8.0, 0.25),
                                 bench_output(66.666666, 0.5)], BENCH_DEVICES)
    cluster = {"devices": ["RPC0", "RPC1"], "tensor_split": [6, 2], "strategy": "memory", "tg_tps": 150.254}
    assert llama_calibrate_table(speeds, BENCH_DEVICES, cluster) == [
        "device  host (device)                tg t/s      +/-   speed",
        "RPC0    a (CUDA0)                    100.00     2.35   1.000",
        "RPC1    a (CUDA1)                     40.00     1.00   0.400",
        "RPC2    b (CPU)                        8.00     0.25   0.080",
        "CUDA0   m (CUDA0)                     66.67     0.50   0.667",
        "cluster RPC0,RPC1 --tensor-split 6,2 (memory): 150.25 t/s",
    ]
    assert llama_calibrate_table(speeds, BENCH_DEVICES) == llama_calibrate_table(speeds, BENCH_DEVICES, cluster)[:-1]
    assert llama_calibrate_table(speeds, BENCH_DEVICES, dict(cluster, tg_tps=None))[-1].startswith("CUDA0")


def test_bench_table_names_an_unmeasured_device():
    speeds = {"a": {"CUDA0": {"speed": 1.0, "tg_tps": 1.0, "tg_tps_stddev": 0.0, "device": "RPC0"}}}
    with pytest.raises(AnsibleFilterError) as err:
        llama_calibrate_table(speeds, BENCH_DEVICES[:2])
    assert str(err.value) == "RPC1 (a CUDA1) has no measured speed (the speeds have hosts a)"


def test_host_networks():
    assert llama_host_networks(["10.0.0.5", "fd00::0:5", "::ffff:10.0.0.5"]) == [
        "10.0.0.5/32", "fd00::5/128", "::ffff:a00:5/128"]
    assert llama_host_networks([]) == []


@pytest.mark.parametrize("addresses, message", [
    (["10.0.0.5", "master"], "llama_host_networks: 'master' is not an IP address$"),
    (["10.0.0.0/24"], "llama_host_networks: '10.0.0.0/24' is not an IP address$"),
    ([167772165], "llama_host_networks: 167772165 is not an IP address$"),
    (["fe80::1%eth0"], r"llama_host_networks: 'fe80::1%eth0' has a zone \(%eth0\): give the address without it"),
    ("10.0.0.5", "llama_host_networks needs a list of IP addresses, got '10.0.0.5'"),
])
def test_host_networks_name_the_bad_value(addresses, message):
    with pytest.raises(AnsibleFilterError, match=f"^{message}"):
        llama_host_networks(addresses)


@pytest.mark.parametrize("module, names", [
    (llama_devices, ("llama_device_order", "llama_rpc_endpoints", "llama_devices_with_speeds", "llama_select_devices")),
    (llama_calibrate, ("llama_calibrate_speeds", "llama_calibrate_table")),
    (llama_host, ("llama_failure_messages", "llama_port_conflicts", "llama_cluster_address", "llama_host_networks")),
])
def test_each_file_registers_its_owner_s_filters(module, names):
    assert module.FilterModule().filters() == {name: getattr(module, name) for name in names}


def test_vulkan_names_a_fresh_host_cannot_list_yet_are_provisional():
    """Before its first Vulkan build a host lists only its CPU: Vulkan<n> stands for a device to be named by
    llama.cpp once installed (first, as llama.cpp lists GPUs before the CPU); other unknown names still fail."""
    cpu_only = [{"name": "CPU", "memory_mib": 24105}]
    selected = llama_select_devices(cpu_only, ["CPU", "Vulkan0"], "w2", "Vulkan")
    assert selected == [{"name": "Vulkan0", "memory_mib": 24105, "provisional": True}, cpu_only[0]]
    with pytest.raises(AnsibleFilterError, match="^w2: llama_rpc_devices names CUDA0, but w2 has CPU"):
        llama_select_devices(cpu_only, ["CUDA0", "Vulkan0"], "w2", "Vulkan")
    with pytest.raises(AnsibleFilterError, match="^w2: llama_rpc_devices names Vulkan0, but w2 has CPU"):
        llama_select_devices(cpu_only, ["Vulkan0"], "w2")
