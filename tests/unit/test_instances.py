"""llama_instances and llama_instance_shares: several llama-server instances from one inventory. Today's inventory is
one instance; every bad input named in issue 44 is an error naming the instance, the variable and the fix."""

import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_instances import (
    llama_front_routes, llama_instance_served, llama_instance_shares, llama_instance_workers, llama_instances)

SINGLE = {"model_path": "/srv/models/a.gguf", "model_sha256": "ab" * 32, "port": 8081, "ctx_size": 4096,
          "parallel": 2, "tensor_split": [], "split_strategy": "memory", "reserve_fraction": 0.15}
WORKERS = ["w1", "w2", "w3"]
HOSTS = {"m": {"reserved": {8080: "the API front (llama_server_port)"}}, "w1": {"rpc_port": 50052},
         "w2": {"rpc_port": 50052}, "w3": {"rpc_port": 50060}}


def instances(declared, hosts=HOSTS):
    return llama_instances(declared, SINGLE, "m", WORKERS, hosts)


def fails(declared, pattern, hosts=HOSTS):
    with pytest.raises(AnsibleFilterError) as error:
        instances(declared, hosts)
    assert re.search(pattern, str(error.value)), str(error.value)


TWO = [{"name": "chat", "model_path": "/srv/models/c.gguf", "workers": ["w1", "w2"]},
       {"name": "code", "model_path": "/srv/models/b.gguf", "workers": ["w2", {"host": "w3", "devices": ["CUDA0"]}],
        "ctx_size": 8192, "master": "w1"}]


def test_todays_inventory_is_one_instance_over_every_worker():
    (one,) = instances([])
    assert one["name"] == "default" and one["default"] and one["replicas"] == ["default"]
    assert one["model_path"] == SINGLE["model_path"] and one["model_sha256"] == SINGLE["model_sha256"]
    assert one["master"] == "m" and one["port"] == 8081 and one["ctx_size"] == 4096
    assert (one["unit"], one["rpc_unit"], one["served_name"]) == ("llama-server.service", "llama-rpc-server.service",
                                                                  "a")
    # Each worker's own llama_rpc_port, as today.
    assert one["workers"] == [{"host": "w1", "devices": [], "rpc_port": 50052},
                              {"host": "w2", "devices": [], "rpc_port": 50052},
                              {"host": "w3", "devices": [], "rpc_port": 50060}]
    assert instances(None) == instances([])
    assert llama_instances([], dict(SINGLE, served_name="smollm2"), "m", WORKERS, HOSTS)[0]["served_name"] == "smollm2"


def test_two_models_get_their_own_units_ports_and_settings():
    own, chat, code = instances(TWO)
    assert (own["port"], chat["port"], code["port"]) == (8081, 8082, 8083)
    assert [worker["rpc_port"] for worker in chat["workers"]] == [50053, 50053]
    assert [worker["rpc_port"] for worker in code["workers"]] == [50054, 50062]
    assert (chat["unit"], chat["rpc_unit"]) == ("llama-server-chat.service", "llama-rpc-server-chat.service")
    assert code["workers"][1]["devices"] == ["CUDA0"] and code["master"] == "w1"
    assert (chat["ctx_size"], code["ctx_size"]) == (4096, 8192)
    assert own["default"] and not chat["default"] and not code["default"]
    assert chat["served_name"] == "c" and chat["replicas"] == ["chat"]
    assert (own["backend"], own["server"], code["backend"], code["server"]) == ("llama_server", "llama-server",
                                                                               "llama_server_code", "code")
    assert chat["model_sha256"] == ""  # an instance's checksum is its own, never the cluster's


def test_instances_serving_one_model_are_replicas():
    declared = [{"name": "a", "model_path": "/srv/models/a.gguf", "workers": ["w1"], "master": "w2"},
                {"name": "b", "model_path": "/m.gguf", "served_name": "smollm2", "workers": ["w2"]}]
    own, first, second = instances(declared)
    assert own["replicas"] == first["replicas"] == ["default", "a"]  # the same file name: the same model
    assert first["backend"] == "llama_server" and first["server"] == "a"
    assert second["replicas"] == ["b"] and second["served_name"] == "smollm2"


def test_two_instances_claiming_one_port_on_one_host():
    declared = [dict(TWO[0], rpc_port=50070), dict(TWO[1], rpc_port=50070)]
    fails(declared, r"instance 'code': port 50070 on w2 \(llama_instances\[1\]\.rpc_port\) is taken by instance "
                    r"'chat' \(llama_instances\[0\]\.rpc_port\): set llama_instances\[1\]\.rpc_port to another port")
    fails([dict(TWO[0], port=9000), dict(TWO[1], port=9000, master="m")],
          r"instance 'code': port 9000 on m \(llama_instances\[1\]\.port\) is taken by instance 'chat'")
    fails([dict(TWO[0], port=8081)], r"instance 'chat': port 8081 on m \(llama_instances\[0\]\.port\) is taken by "
                                     r"instance 'default' \(llama_server_internal_port\)")
    fails([dict(TWO[0], rpc_port=50052)], r"instance 'chat': port 50052 on w1 \(llama_instances\[0\]\.rpc_port\) is "
                                          r"taken by instance 'default' \(llama_rpc_port\)")


def test_an_instance_on_a_port_the_host_uses_already():
    fails([dict(TWO[0], port=8080)], r"instance 'chat': port 8080 on m \(llama_instances\[0\]\.port\) is taken by the "
                                     r"API front \(llama_server_port\): set llama_instances\[0\]\.port")


def test_an_instance_without_a_model():
    fails([{"name": "chat", "workers": ["w1"]}],
          r"instance 'chat' \(llama_instances\[0\]\) has no model_path: set llama_instances\[0\]\.model_path")


def test_two_instances_with_one_name():
    fails([TWO[0], dict(TWO[1], name="chat")],
          r"llama_instances\[1\]: the name 'chat' is taken by llama_instances\[0\]: give each instance its own name")
    fails([dict(TWO[0], name="default")], r"llama_instances\[0\]: the name 'default' is taken by the cluster's own "
                                          r"instance")


@pytest.mark.parametrize("declared, pattern", [
    ([{"name": "Chat!", "model_path": "/a"}], r"llama_instances\[0\]\.name must be a short lower-case name"),
    ([{"name": "chat", "model_path": "/a", "workers": ["w9"]}],
     r"llama_instances\[0\]\.workers\[0\] names 'w9', which is not in llama_workers \(w1, w2, w3\)"),
    ([{"name": "chat", "model_path": "/a", "workers": ["w1", {"host": "w1"}]}], r"names 'w1' twice"),
    ([{"name": "chat", "model_path": "/a", "workers": []}], r"must list the hosts of llama_workers"),
    ([{"name": "chat", "model_path": "/a", "master": "elsewhere"}],
     r"instance 'chat' \(llama_instances\[0\]\): master 'elsewhere' is not a host of llama_master or llama_workers"),
    ([{"name": "chat", "model_path": "/a", "ctx": 4096}], r"llama_instances\[0\] has unknown key\(s\) ctx"),
    ([{"name": "chat", "model_path": "/a", "port": 70000}], r"llama_instances\[0\]\.port must be a TCP port"),
    ([{"name": "chat", "model_path": "/a", "rpc_port": 0}], r"llama_instances\[0\]\.rpc_port must be a TCP port"),
    ("chat", r"llama_instances must be a list of instances"),
])
def test_bad_input_is_named(declared, pattern):
    fails(declared, pattern)


DEVICES = {"w1": ["CUDA0", "CUDA1"], "w2": ["CPU"], "w3": ["CUDA0", "Vulkan0"]}


def test_a_shared_device_is_split_evenly_unless_the_host_says():
    _, chat, code = instances(TWO)
    shares = llama_instance_shares([chat, code], DEVICES)
    assert shares["chat"] == {"w1": {"CUDA0": 1.0, "CUDA1": 1.0}, "w2": {"CPU": 0.5}}
    assert shares["code"] == {"w2": {"CPU": 0.5}, "w3": {"CUDA0": 1.0}}
    shares = llama_instance_shares([chat, code], DEVICES, {"w2": {"code": 0.75}})
    assert (shares["chat"]["w2"]["CPU"], shares["code"]["w2"]["CPU"]) == (0.25, 0.75)


def test_a_device_given_beyond_its_memory():
    with pytest.raises(AnsibleFilterError, match=r"w2: device CPU is given to 'chat', 'code' beyond its memory \(their "
                                                 r"llama_instance_shares add up to 1\.2\): lower the shares"):
        llama_instance_shares(instances(TWO)[1:], DEVICES, {"w2": {"chat": 0.6, "code": 0.6}})
    with pytest.raises(AnsibleFilterError, match=r"add up to 1, and 'chat' get nothing"):
        llama_instance_shares(instances(TWO)[1:], DEVICES, {"w2": {"code": 1.0}})


def test_an_unknown_instance_named_in_a_hosts_variables():
    with pytest.raises(AnsibleFilterError, match=r"w1: llama_instance_shares names the instance 'chta', which "
                                                 r"llama_instances does not declare \(chat, code\)"):
        llama_instance_shares(instances(TWO)[1:], DEVICES, {"w1": {"chta": 0.5}})


def test_a_device_the_worker_does_not_have():
    with pytest.raises(AnsibleFilterError, match=r"instance 'code': w3 has no device CUDA1"):
        llama_instance_shares(instances([TWO[0], dict(TWO[1], workers=[{"host": "w3", "devices": ["CUDA1"]}])])[1:],
                              DEVICES)


def test_a_worker_runs_one_rpc_server_per_other_instance_that_uses_it():
    found = instances(TWO)
    assert llama_instance_workers(found, "w1") == [
        {"name": "chat", "unit": "llama-rpc-server-chat.service", "port": 50053, "devices": [], "master": "m",
         "server_unit": "llama-server-chat.service"}]
    assert [entry["name"] for entry in llama_instance_workers(found, "w2")] == ["chat", "code"]
    assert llama_instance_workers(found, "w3") == [
        {"name": "code", "unit": "llama-rpc-server-code.service", "port": 50062, "devices": ["CUDA0"], "master": "w1",
         "server_unit": "llama-server-code.service"}]
    assert llama_instance_workers(instances([]), "w1") == []


def test_the_worker_as_an_instance_sees_it():
    worker = {"host": "w3", "unit": "llama-rpc-server.service", "port": 50060, "endpoint": "10.0.0.3:50060",
              "devices": [{"name": "CUDA0", "memory_mib": 8192}, {"name": "Vulkan0", "memory_mib": 4096}]}
    (code,) = llama_instance_workers(instances(TWO), "w3", worker)
    assert code["worker"]["endpoint"] == "10.0.0.3:50062" and code["worker"]["port"] == 50062
    assert code["worker"]["unit"] == "llama-rpc-server-code.service"
    assert code["worker"]["devices"] == [{"name": "CUDA0", "memory_mib": 8192}]
    with pytest.raises(AnsibleFilterError, match=r"instance 'code': w3 has no device CUDA0 \(llama_instances\[1\]"
                                                 r"\.workers; it has Vulkan0\)"):
        llama_instance_workers(instances(TWO), "w3", dict(worker, devices=worker["devices"][1:]))


def test_each_rpc_server_admits_its_instances_master_only():
    addresses = {"m": "10.0.0.1", "w1": "10.0.0.11", "w2": "10.0.0.12", "w3": "10.0.0.13"}
    worker = {"host": "w2", "endpoint": "10.0.0.12:50052", "devices": [{"name": "CPU", "memory_mib": 4096}]}
    chat, code = llama_instance_workers(instances(TWO), "w2", worker, addresses)
    assert (chat["peer"], code["peer"]) == ("10.0.0.1", "10.0.0.11")
    assert code["rule"] == {"name": "RPC code", "proto": "tcp", "port": 50054, "sources": ["10.0.0.11"]}


def test_an_instance_listens_on_loopback_on_the_fronts_host_only():
    _, chat, code = instances(TWO)
    planned = {"devices": [], "rpc": [], "plan": {}, "table": []}
    gguf = {"model": {"n_layer": 30}, "gguf": {"name": "x"}}
    here = llama_instance_served((chat, {"path": "/a"}, gguf, planned), "10.0.0.1", "m", "10.0.0.1", "m")
    assert (here["listen"], here["rules"], here["url"]) == ("127.0.0.1", [], "http://127.0.0.1:8082")
    there = llama_instance_served((code, {"path": "/b"}, gguf, planned), "10.0.0.11", "m", "10.0.0.1", "w1")
    assert there["url"] == "http://10.0.0.11:8083" and there["model"] == {"n_layer": 30, "name": "x"}
    assert there["rules"] == [{"name": "API code", "proto": "tcp", "port": 8083, "sources": ["10.0.0.1"]}]


def test_the_front_routes_each_model_to_its_replicas():
    declared = [{"name": "b", "model_path": "/srv/models/a.gguf", "master": "w1", "workers": ["w2"]},
                {"name": "chat", "model_path": "/srv/models/c.gguf", "workers": ["w3"]}]
    routes = llama_front_routes(instances(declared), "m", {"m": "10.0.0.1", "w1": "10.0.0.11"})
    assert routes == [
        {"model": "a", "backend": "llama_server",
         "servers": [{"name": "default", "address": "127.0.0.1", "port": 8081, "server": "llama-server"},
                     {"name": "b", "address": "10.0.0.11", "port": 8082, "server": "b"}]},
        {"model": "c", "backend": "llama_server_chat",
         "servers": [{"name": "chat", "address": "127.0.0.1", "port": 8083, "server": "chat"}]}]


def test_a_model_name_the_front_cannot_route_by():
    fails([{"name": "chat", "model_path": "/a.gguf", "served_name": "my model"}],
          r"instance 'chat' \(llama_instances\[0\]\): the model name 'my model' .* "
          r"set llama_instances\[0\]\.served_name")
    fails([{"name": "w", "model_path": "/a.gguf"}, {"name": "watch", "model_path": "/b.gguf"}],
          r"llama_instances\[1\]\.name: 'watch' is taken")


def test_the_shares_alone_are_checked_before_the_devices_are_known():
    assert llama_instance_shares(instances(TWO), None, {"w2": {"code": 0.75}}) == {}
    with pytest.raises(AnsibleFilterError, match=r"w1: llama_instance_shares names the instance 'x'"):
        llama_instance_shares(instances(TWO), None, {"w1": {"x": 0.5}})
    with pytest.raises(AnsibleFilterError, match=r"instance 'default' \(the cluster's own instance\) has no "
                                                 r"model_path: set llama_model_path"):
        llama_instances([TWO[0]], dict(SINGLE, model_path=""), "m", WORKERS, HOSTS)


def test_the_cluster_s_own_ports_are_left_to_its_roles_preflight():
    """llama_server_internal_port equal to the front's port is the llama_server role's preflight error, as without
    instances (the cluster scenario's refusal run expects it); an instance on it is still named."""
    hosts = dict(HOSTS, m={"reserved": {8081: "the API front (llama_server_port)"}})
    (own,) = instances([], hosts)
    assert own["port"] == 8081
    fails([{"name": "b", "model_path": "/b.gguf", "port": 8081}], r"instance 'b': port 8081 on m .* is taken by "
                                                                   r"instance 'default'", hosts)
