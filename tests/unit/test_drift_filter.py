"""plugins/filter/llama_verify.py: llama_drift, the per-node verdict of playbooks/verify.yml."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_verify import llama_drift

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
BUILD = {"build_id": "llama.cpp-0c1e57098bba-cpu-debian12-x86_64-abc", "commit": COMMIT, "rpc_proto": "7.0.0"}
CURRENT = "/opt/llama.cpp/llama.cpp-0c1e57098bba-cpu-debian12-x86_64-abc"
SWITCHED, STARTED = 1_700_000_000, 1_700_000_030


def show(state="active", pid=42, build_id=BUILD["build_id"]):
    return (f"MainPID={pid}\nActiveState={state}\n"
            f"Environment=LLAMA_CACHE=/var/cache/llama.cpp LLAMACPP_BUILD_ID={build_id} CUDA_DEVICE_ORDER=PCI_BUS_ID")


def worker(**kwargs):
    return llama_drift(BUILD, COMMIT, ["7.0.0", "7.0.0"], CURRENT, ["llama-rpc-server.service"],
                       [show(**kwargs)], [STARTED], SWITCHED)


SS = "0 0 10.0.0.1:41000 10.0.0.2:50052\n0 0 10.0.0.1:41002 10.0.0.3:50052\n0 0 10.0.0.1:22 10.0.0.9:50000\n"
CMDLINE = "\0".join([f"{CURRENT}/bin/llama-server", "--rpc", "10.0.0.2:50052,10.0.0.3:50052", "--device",
                     "RPC0,RPC1", ""])


def master(connections=SS):
    return llama_drift(BUILD, COMMIT, ["7.0.0"], CURRENT, ["llama-server.service"], [show()], [STARTED], SWITCHED,
                       CMDLINE, connections)


def test_a_node_that_matches_has_no_drift():
    assert worker() == [] and master() == []


def test_another_commit_is_named():
    other = dict(BUILD, commit="e3a74b299085cd00013804f7fca2e03441b2da20", rpc_proto="4.0.1")
    problems = llama_drift(other, COMMIT, ["4.0.1", "7.0.0"], CURRENT, [], [], [], SWITCHED)
    assert problems == [f"runs commit {other['commit']}, not llamacpp_commit {COMMIT}",
                        "speaks RPC protocol 4.0.1, other nodes 7.0.0"]


def test_a_stopped_unit_is_named():
    assert worker(state="failed", pid=0) == ["llama-rpc-server.service is failed, not active"]


def test_a_unit_set_up_for_another_build_is_named():
    assert worker(build_id="llama.cpp-e3a74b299085-cpu-x") == [
        f"llama-rpc-server.service is set up for llama.cpp-e3a74b299085-cpu-x, not the active build {BUILD['build_id']}"]


def test_a_process_started_before_current_was_switched_is_named():
    problems = llama_drift(BUILD, COMMIT, [], CURRENT, ["llama-rpc-server.service"], [show()], [SWITCHED - 60],
                           SWITCHED)
    assert problems == [f"llama-rpc-server.service was started before current was switched to {CURRENT}: it still "
                        f"runs the build before (restart it)"]
    # A restart in the second of the switch is not drift.
    assert llama_drift(BUILD, COMMIT, [], CURRENT, ["a.service"], [show()], [SWITCHED - 1], SWITCHED) == []


def test_a_master_serving_without_a_worker_is_named():
    problems = master(connections=SS.splitlines()[0])
    assert problems == ["llama-server serves without 10.0.0.3:50052: no connection, so on fewer devices than planned "
                        "(1 of the 2 RPC workers of its plan)"]


def test_connections_to_other_ports_do_not_count():
    assert len(master(connections=SS.replace("10.0.0.3:50052", "10.0.0.3:50053"))) == 1


def test_no_build_is_named():
    assert llama_drift({}, COMMIT, [], "", [], [], [], 0) == ["no readable active build (current/BUILD-INFO.json)"]


def test_mismatched_lists_are_refused():
    with pytest.raises(AnsibleFilterError):
        llama_drift(BUILD, COMMIT, [], CURRENT, ["a.service"], [], [], SWITCHED)
