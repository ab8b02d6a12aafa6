"""Reading a host's listening sockets (which ports the cluster needs are held by something else), its cluster address,
and a failed check's messages for a preflight that collects them."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_host import (llama_cluster_address, llama_failure_messages,
                                                                         llama_port_conflicts)

DOCKER = "/docker/3fb389a19fe7/system.slice"
SS = f"""\
LISTEN 0      1      172.18.0.3:50052 0.0.0.0:* uid:997 ino:103265 sk:2 cgroup:{DOCKER}/llama-rpc-server.service <->
LISTEN 0      512       0.0.0.0:8080  0.0.0.0:* uid:997 ino:188951 sk:1002 cgroup:/system.slice/llama-server.service <->
LISTEN 0      5               *:18080       *:* users:(("python3",pid=9,fd=3),("python3",pid=10,fd=3)) ino:7 sk:3 cgroup:/system.slice/port-thief.service <->
LISTEN 0      4096   127.0.0.11:34581 0.0.0.0:* ino:20412 sk:1 cgroup:/ <->
LISTEN 0      128          [::]:22       [::]:* ino:5 sk:4 cgroup:/system.slice/ssh.service <->
"""
RPC = {"variable": "llama_rpc_port", "port": 50052, "unit": "llama-rpc-server.service"}
API = {"variable": "llama_server_port", "port": 8080, "unit": "llama-server.service"}


def test_ports_held_by_the_cluster_itself_are_no_conflict():
    assert llama_port_conflicts(SS, [RPC, API]) == []


def test_a_port_held_by_something_else_is_named_by_process_or_unit():
    assert llama_port_conflicts(SS, [dict(API, port=18080), dict(RPC, port=22)]) == [
        {"variable": "llama_server_port", "port": 18080, "address": "*", "holder": "python3"},
        {"variable": "llama_rpc_port", "port": 22, "address": "::", "holder": "ssh.service"},
    ]


def test_swapped_ports_conflict():
    """A host in both groups: the API port held by the RPC server is no free port for llama-server."""
    assert llama_port_conflicts(SS, [dict(API, port=50052)])[0]["holder"] == "llama-rpc-server.service"


def test_a_socket_outside_any_unit_conflicts():
    conflict = llama_port_conflicts(SS, [dict(API, port=34581)])
    assert conflict == [{"variable": "llama_server_port", "port": 34581, "address": "127.0.0.11",
                         "holder": "another program"}]


def test_unreadable_output_is_an_error():
    with pytest.raises(AnsibleFilterError, match="cannot read the local address"):
        llama_port_conflicts("LISTEN 0 1 nonsense peer", [API])


# --- llama_cluster_address: the contract's fallback chain --------------------------------------------------
ROUTED = {"default_ipv4": {"address": "10.0.0.5"}, "all_ipv4_addresses": ["127.0.0.1", "10.0.0.5", "192.168.9.5"]}
NO_ROUTE_TWO = {"default_ipv4": {}, "all_ipv4_addresses": ["10.0.0.5", "192.168.9.5", "127.0.0.1"]}
NO_ROUTE_ONE = {"all_ipv4_addresses": ["127.0.0.1", "192.168.9.5"]}


def test_the_inventory_wins():
    assert llama_cluster_address(ROUTED, "192.168.9.5", "10.0.0.5")["address"] == "192.168.9.5"


def test_the_default_route_comes_next():
    assert llama_cluster_address(ROUTED, "", "192.168.9.5") == {
        "address": "10.0.0.5", "source": "the default route", "candidates": ["10.0.0.5", "192.168.9.5"]}


def test_without_a_route_ansible_host_when_it_is_an_address():
    assert llama_cluster_address(NO_ROUTE_TWO, "", "192.168.9.5")["source"] == "ansible_host"
    assert llama_cluster_address(NO_ROUTE_TWO, "", " 192.168.9.5 ")["address"] == "192.168.9.5"


def test_then_the_only_address():
    picked = llama_cluster_address(NO_ROUTE_ONE, "", "worker1.lan")
    assert (picked["address"], picked["source"]) == ("192.168.9.5", "its only IPv4 address")


def test_ambiguous_is_empty_with_the_candidates():
    assert llama_cluster_address(NO_ROUTE_TWO, "", "worker1.lan") == {
        "address": "", "source": "", "candidates": ["10.0.0.5", "192.168.9.5"]}


def test_a_port_may_belong_to_any_of_several_units():
    """With llama_rpc_transport tls the RPC port's public socket is the TLS terminator's."""
    tls = SS.replace("/llama-rpc-server.service", "/llama-rpc-tls.service")
    both = dict(RPC, unit=["llama-rpc-server.service", "llama-rpc-tls.service"])
    assert llama_port_conflicts(tls, [both]) == []
    assert llama_port_conflicts(tls, [RPC])[0]["holder"] == "llama-rpc-tls.service"


def test_a_failed_assert_gives_its_message():
    assert llama_failure_messages({"failed": True, "msg": "master: llamacpp_commit must be"}) == [
        "master: llamacpp_commit must be"]


def test_a_list_of_problems_gives_each():
    assert llama_failure_messages({"failed": True, "msg": ["master: one", "master: two"]}) == ["master: one", "master: two"]


def test_a_loop_gives_each_failed_item():
    result = {"failed": True, "msg": "One or more items failed",
              "results": [{"failed": False, "msg": "fine"}, {"failed": True, "msg": "worker1: a"}, {"failed": True, "msg": "worker1: b"}]}
    assert llama_failure_messages(result) == ["worker1: a", "worker1: b"]


def test_a_failure_without_a_message_is_still_a_problem():
    assert llama_failure_messages({"failed": True}) == ["a check failed without a message"]
