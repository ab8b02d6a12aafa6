"""Unit tests of playbooks/status.yml's parts: the module llama_node_status's readers (on the text the tools print,
taken from a running cluster, and through its main() on this machine) and the filter llama_status_report (on fixed
nodes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils import llama_node
from ansible_collections.llamacpp.rpc_cluster.plugins.modules import llama_node_status as status_module  # its main(); the readers are llama_node's (conftest loads both)
import pytest
from ansible.errors import AnsibleFilterError
from ansible.module_utils.testing import patch_module_args
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_verify import llama_status_report, llama_status_table

NODE_READER = Path(__file__).resolve().parents[2] / "plugins" / "module_utils" / "llama_node.py"
NOW = 1_800_000_000.0
MIB = 1 << 20
BUILD = {"commit": "0c1e57098bba" + "0" * 28, "backend": "cpu", "rpc_proto": "3.0.0",
         "build_id": "llama.cpp-0c1e57098bba-cpu-debian12-x86_64-32ce5720006e"}
SHOW = """Id=llama-rpc-server.service
LoadState=loaded
ActiveState=active
SubState=running
MainPID=1412
NRestarts=2
ActiveEnterTimestampMonotonic=72521140683
MemoryCurrent=42700800
Environment=LLAMA_CACHE=/var/cache/llama.cpp LLAMACPP_BUILD_ID=llama.cpp-0c1e57098bba-cpu-debian12-x86_64-32ce5720006e

Id=nonexist.service
LoadState=not-found
ActiveState=inactive
SubState=dead
MainPID=0
NRestarts=0
ActiveEnterTimestampMonotonic=0
MemoryCurrent=[not set]
Environment=
"""
STAT = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot\n"
        "api,FRONTEND,,,3,5,256,30\n"
        "llama_hold,gate,0,0,2,2,,12\n"
        "gate,FRONTEND,,,2,4,256,12\n")
TRACKING = ("C0A80001,master,3,1799999990.000000000,0.000024401,-0.000121800,0.000121800,-0.191,0.000,0.000,"
            "1.000000000,1.000000000,68.0,Normal\n")




def test_units_are_read_from_one_systemctl_call():
    blocks = llama_node.parse_show(SHOW)
    assert [block["Id"] for block in blocks] == ["llama-rpc-server.service", "nonexist.service"]
    unit = llama_node.unit_state("llama-rpc-server.service", blocks[0], started=1_700_000_100, booted=1_700_000_000)
    assert unit["active_state"] == "active" and unit["main_pid"] == 1412 and unit["restarts"] == 2
    assert unit["since"] == 1_700_000_000 + 72521  # boot + the monotonic stamp
    assert unit["memory_bytes"] == 42700800
    assert unit["build_id"] == BUILD["build_id"]
    missing = llama_node.unit_state("nonexist.service", blocks[1], started=0, booted=1_700_000_000)
    assert missing["load_state"] == "not-found" and missing["since"] == 0 and missing["memory_bytes"] is None


def test_the_front_holds_what_its_gate_has_not_passed_on():
    """Held: the gate's sessions that llama-server does not serve yet. A request llama-server is answering is a
    session of the gate too (it passes through), but not a held one: under steady traffic nothing is held."""
    assert llama_node.parse_front_stat(STAT) == {"held": 2, "sessions": 3}
    serving = STAT + "llama_server,llama-server,0,0,2,2,,9\nllama_server,BACKEND,0,0,2,2,,9\n"
    assert llama_node.parse_front_stat(serving) == {"held": 0, "sessions": 3}
    one_of_three = STAT.replace("gate,FRONTEND,,,2", "gate,FRONTEND,,,3") + "llama_server,BACKEND,0,0,2,2,,9\n"
    assert llama_node.parse_front_stat(one_of_three) == {"held": 1, "sessions": 3}
    assert llama_node.parse_front_stat("Unknown command\n") is None


def test_chrony_offset_and_leap():
    assert llama_node.parse_tracking(TRACKING) == {"offset_s": 0.000024401, "leap": "Normal", "reference": "master"}
    assert llama_node.parse_tracking("506 Cannot talk to daemon\n") is None


def test_gpus_connections_and_memory():
    assert llama_node.parse_nvidia_smi("0, NVIDIA H200, 1024, 143771\n") == [
        {"index": 0, "name": "NVIDIA H200", "used_mib": 1024, "total_mib": 143771}]
    assert llama_node.parse_connections("0 0 10.0.0.2:50052 10.0.0.1:41234\n") == [["10.0.0.2:50052",
                                                                                     "10.0.0.1:41234"]]
    assert llama_node.parse_meminfo("MemTotal: 1024 kB\nMemAvailable: 512 kB\n") == {
        "total_bytes": 1048576, "available_bytes": 524288}


def test_the_module_reads_this_machine_without_changing_it(capsys, tmp_path):
    (tmp_path / "rpc").mkdir()
    (tmp_path / "rpc" / "0123456789abcdef").write_bytes(b"x" * 100)
    with patch_module_args({"install_root": str(tmp_path / "none"), "units": ["nonexist-llama.service"],
                            "cache_dir": str(tmp_path), "_ansible_check_mode": True}), pytest.raises(SystemExit):
        status_module.main()
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] is False and result["build"] == {} and result["current"] == ""
    assert result["cache"] == {"entries": 1, "bytes": 100}
    assert result["memory"]["total_bytes"] > 0


def unit(name, build_id=BUILD["build_id"], active="active", started=NOW - 600):
    return {"name": name, "load_state": "loaded", "active_state": active, "sub_state": "running",
            "main_pid": 100 if active == "active" else 0, "restarts": 0, "since": started, "started": started,
            "memory_bytes": 80 << 20, "build_id": build_id,
            "show": f"ActiveState={active}\nMainPID=100\nEnvironment=LLAMACPP_BUILD_ID={build_id}"}


def node(host, role, address, units, connections=(), cmdline=(), plan=None, **status):
    read = {"build": dict(BUILD), "current": "/opt/llama.cpp/x", "switched": NOW - 3600, "units": units,
            "cmdline": list(cmdline), "connections": [list(pair) for pair in connections], "plan": plan or {},
            "memory": {"total_bytes": 8 << 30, "available_bytes": 6 << 30}, "gpus": [], "cache": None,
            "clock": {"offset_s": 0.0002, "leap": "Normal", "reference": "master"}, "front": None}
    read.update(status)
    return {"host": host, "master": role == "master", "worker": role == "worker", "address": address,
            "commit": BUILD["commit"], "rpc_port": 50052, "cache_max_mib": 1024, "status": read}


PLAN = {"model": {"source": "/srv/models/m.gguf", "sha256": "ab" * 32, "mode": "stage", "n_layer": 30,
                  "path": "/var/lib/llama.cpp/models/abababababab/m.gguf"},
        "rpc": ["10.0.0.2:50052", "10.0.0.3:50052"],
        "plan": {"devices": ["RPC0", "RPC1"], "layers": [[0, 16], [16, 31]], "bytes": [60 << 20, 55 << 20],
                 "budget_bytes": [1 << 30, 1 << 30], "tensor_split": [16, 15], "strategy": "memory"},
        "hosts": {"RPC0": "worker1", "RPC1": "worker2"}}
HEALTH = {"server": {"url": "http://127.0.0.1:8081/health", "status": 200, "error": ""},
          "front": {"url": "http://127.0.0.1:8080/health", "status": 200, "error": ""}}
CMDLINE = ["/opt/llama.cpp/current/bin/llama-server", "--rpc", "10.0.0.2:50052,10.0.0.3:50052", "-m", "m.gguf"]


def cluster(master_connections=(("10.0.0.1:40000", "10.0.0.2:50052"), ("10.0.0.1:40001", "10.0.0.3:50052")),
            **worker2):
    return [
        node("master", "master", "10.0.0.1", [unit("llama-server.service"), unit("chrony.service", build_id="")],
             connections=master_connections, cmdline=CMDLINE, plan=PLAN,
             front={"held": 0, "sessions": 4}, health=HEALTH),
        node("worker1", "worker", "10.0.0.2", [unit("llama-rpc-server.service")],
             connections=[("10.0.0.2:50052", "10.0.0.1:40000")], cache={"entries": 2, "bytes": 100 << 20}),
        node("worker2", "worker", "10.0.0.3", [unit("llama-rpc-server.service")],
             **dict({"connections": [("10.0.0.3:50052", "10.0.0.1:40001")]}, **worker2)),
    ]


def row(table, first):
    """The cells (split at blanks) of the table's line that begins with `first`."""
    return next(line.split() for line in table.splitlines() if line.startswith(first + " "))


def test_a_healthy_cluster_in_one_table():
    report = llama_status_report(cluster(), now=NOW)
    assert report["healthy"] and report["problems"] == []
    table = "\n".join(report["table"])
    assert table.splitlines()[-1] == "healthy"
    rows = {row["host"]: row for row in report["nodes"]}
    assert rows["worker1"]["devices"] == [{"name": "RPC0", "layers": "0-15", "planned_layers": 16,
                                           "planned_bytes": 60 << 20, "layers_loaded": None, "loaded_bytes": None}]
    assert rows["worker2"]["devices"][0]["layers"] == "16-30+out"
    assert rows["worker1"]["connected"] is True and rows["master"]["connected"] is None
    assert "worker1  worker" in table and "0c1e570 cpu rpc 3.0.0" in table and "10m" in table
    assert "device  host     layers planned  loaded  bytes planned  weights loaded  its RPC server holds" in table
    assert row(table, "RPC1") == ["RPC1", "worker2", "16-30+out", "?", "55", "MiB", "?", "80", "MiB"]
    assert "(loaded ?: llama-server's log does not say; llama_server_log_verbosity 4" in table
    assert "model: /srv/models/m.gguf, sha256 abababababab, stage mode" in table
    assert "front on master: 0 requests held, 4 client connections" in table
    assert "/health directly on master: 200" in table and "/health through the front on master: 200" in table
    assert "loaded in" not in table  # llama-server's load unknown (loading, or its journal rotated away)
    loaded = cluster()
    loaded[0]["status"]["load_s"] = 2.14
    assert "/abababababab/m.gguf, loaded in 2.1 s" in "\n".join(llama_status_report(loaded, now=NOW)["table"])
    json.dumps(report)  # status_format=json and status_file print it as it is


def test_a_worker_the_master_does_not_hold_is_named_with_the_fix():
    report = llama_status_report(cluster(master_connections=[("10.0.0.1:40000", "10.0.0.2:50052")],
                                         connections=[]), now=NOW)
    assert not report["healthy"]
    assert report["problems"] == [
        "master: llama-server serves without worker2 (10.0.0.3:50052): no connection, so on fewer devices than "
        "planned (1 of the 2 RPC workers of its plan) "
        "(fix: start the missing RPC servers: the master's worker watch then restarts llama-server onto every "
        "worker of its plan (else site.yml --tags workers,master))"]
    assert {row["host"]: row["connected"] for row in report["nodes"]}["worker2"] is False
    assert report["table"][-2:] == ["UNHEALTHY: 1 problem(s)", f"- {report['problems'][0]}"]


def test_status_only_problems_name_the_variable_and_the_fix():
    nodes = cluster(clock={"offset_s": -2.5, "leap": "Normal", "reference": "master"},
                    cache={"entries": 9, "bytes": 1000 << 20})
    nodes[0]["status"]["units"][1] = unit("chrony.service", build_id="", active="failed")
    problems = llama_status_report(nodes, max_clock_offset=1.0, now=NOW)["problems"]
    assert any(p.startswith("master: chrony.service is failed (fix: systemctl status chrony.service") for p in problems)
    assert any(p.startswith("worker2: clock offset -2.500 s, over llama_status_max_clock_offset (1.0 s)")
               for p in problems)
    assert any(p.startswith("worker2: RPC tensor cache 1000 MiB of its 1.0 GiB cap (llama_rpc_cache_max_mib)")
               for p in problems)


def test_drift_is_verify_yml_s_finding():
    stale = cluster()
    stale[1]["status"]["units"] = [unit("llama-rpc-server.service", build_id="llama.cpp-old")]
    problems = llama_status_report(stale, now=NOW)["problems"]
    assert problems == [f"worker1: llama-rpc-server.service is set up for llama.cpp-old, not the active build "
                        f"{BUILD['build_id']} (fix: site.yml puts a node back on the inventory's build "
                        f"(upgrade.yml when the commit differs))"]


def test_a_stopped_unit_is_named_with_its_journal():
    nodes = cluster()
    nodes[2]["status"]["units"] = [unit("llama-rpc-server.service", active="inactive")]
    problems = llama_status_report(nodes, now=NOW)["problems"]
    assert problems == ["worker2: llama-rpc-server.service is inactive, not active (fix: journalctl -u "
                        "llama-rpc-server.service says why it is inactive; systemd restarts it on a crash, site.yml "
                        "starts it)"]


def test_an_unreachable_node_is_a_row_and_a_problem():
    nodes = cluster()
    nodes[2] = {"host": "worker2", "worker": True, "address": "", "unreachable": True, "status": {}}
    report = llama_status_report(nodes, now=NOW)
    assert report["problems"][-1].startswith("worker2: unreachable (fix: check the host is up")
    assert any(line.startswith("worker2") and "unreachable" in line for line in report["table"])


@pytest.mark.parametrize("nodes", [[], "x", [{"host": "a"}], [{"host": "a", "status": {}}]])
def test_bad_input_is_named(nodes):
    with pytest.raises(AnsibleFilterError, match="llama_status_report"):
        llama_status_report(nodes)


# The node's metrics (plugins/module_utils/llama_node.py node_metrics: the exporter of role llama_metrics), from the same
# reads as the status table.


def exposition(text):
    """{(name, labels): value} of a Prometheus text exposition."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            name, _, labels = name_labels.partition("{")
            samples[(name, labels.rstrip("}"))] = float(value)
    return samples


def test_a_worker_s_metrics():
    worker = cluster()[1]
    text = llama_node.node_metrics(worker["status"], dict(worker, master_address="10.0.0.1"), now=NOW)
    samples = exposition(text)
    assert samples[("llama_cluster_worker_up", "")] == 1
    assert samples[("llama_cluster_worker_connected", "")] == 1
    assert samples[("llama_cluster_rpc_cache_bytes", "")] == 100 << 20
    assert samples[("llama_cluster_rpc_cache_max_bytes", "")] == 1024 << 20
    assert samples[("llama_cluster_unit_active", 'unit="llama-rpc-server.service",llama_instance="default"')] == 1
    assert samples[("llama_cluster_build_info", f'commit="{BUILD["commit"]}",backend="cpu",protocol="3.0.0",'
                                                f'build_id="{BUILD["build_id"]}"')] == 1
    assert samples[("llama_cluster_exporter_timestamp_seconds", "")] == NOW
    lonely = llama_node.node_metrics(dict(worker["status"], connections=[]), dict(worker, master_address="10.0.0.1"))
    assert exposition(lonely)[("llama_cluster_worker_connected", "")] == 0


def test_each_instance_s_units_carry_its_name():
    """llama_instance: `default` for the cluster's own units, NAME for llama-(rpc-)server-NAME, none for the watcher
    and the front (the alert LlamaInstanceUnitDown reads it)."""
    assert [llama_node.unit_instance(unit) for unit in (
        "llama-server.service", "llama-rpc-server.service", "llama-server-b.service", "llama-rpc-server-tiny.service",
        "llama-server-watch.service", "llama-front.service")] == [
        {"llama_instance": "default"}, {"llama_instance": "default"}, {"llama_instance": "b"},
        {"llama_instance": "tiny"}, {}, {}]
    worker = cluster()[1]
    read = dict(worker["status"], units=[*worker["status"]["units"], {
        "name": "llama-rpc-server-b.service", "load_state": "loaded", "active_state": "failed", "restarts": 4}])
    samples = exposition(llama_node.node_metrics(read, dict(worker, master_address="10.0.0.1"), now=NOW))
    labels = 'unit="llama-rpc-server-b.service",llama_instance="b"'
    assert samples[("llama_cluster_unit_active", labels)] == 0
    assert samples[("llama_cluster_unit_restarts_total", labels)] == 4


def test_the_master_s_metrics_count_the_endpoints_it_holds():
    master = cluster(master_connections=[("10.0.0.1:40000", "10.0.0.2:50052")])[0]
    samples = exposition(llama_node.node_metrics(master["status"], master, now=NOW))
    assert samples[("llama_cluster_server_up", "")] == 1
    assert samples[("llama_cluster_rpc_endpoints_planned", "")] == 2
    assert samples[("llama_cluster_rpc_endpoints_connected", "")] == 1
    assert samples[("llama_cluster_device_planned_layers", 'device="RPC1",host="worker2"')] == 15
    assert samples[("llama_cluster_front_held_requests", "")] == 0
    assert samples[("llama_cluster_api_healthy", 'path="front"')] == 1
    assert samples[("llama_cluster_api_healthy", 'path="server"')] == 1
    assert samples[("llama_cluster_model_info", f'source="/srv/models/m.gguf",sha256="{"ab" * 32}",mode="stage"')] == 1


def test_promtool_accepts_every_node_s_metrics(tmp_path, promtool):
    for node in cluster():
        text = llama_node.node_metrics(node["status"], dict(node, master_address="10.0.0.1"), now=NOW)
        checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_exporter_writes_its_file_atomically(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"read": {"install_root": str(tmp_path), "units": [], "cache_dir": str(tmp_path),
                                           "chrony": False},
                                  "node": {"worker": True, "address": "10.0.0.2", "rpc_port": 50052,
                                           "master_address": "10.0.0.1", "cache_max_mib": 1}}))
    out = tmp_path / "llama_cluster.prom"
    done = subprocess.run([sys.executable, str(NODE_READER), str(config),
                           str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    samples = exposition(out.read_text())
    assert samples[("llama_cluster_worker_up", "")] == 0 and samples[("llama_cluster_rpc_cache_max_bytes", "")] == 1 << 20
    assert [path.name for path in tmp_path.iterdir() if path.name.endswith(".tmp")] == []


def test_the_plan_is_the_unit_s_plan_line():
    unit = ("[Service]\n# Plan: RPC0=0-16 RPC1=16-31 (layers, output layer = 30)\n"
            f"# llama-cluster-plan: {json.dumps(PLAN)}\nExecStart=/opt/llama.cpp/current/bin/llama-server\n")
    assert llama_node.parse_plan(unit) == PLAN
    assert llama_node.parse_plan("[Service]\nExecStart=x\n") == {}
    assert llama_node.parse_plan("# llama-cluster-plan: {not json\n") == {}


LOADED_0C1E570 = """1796396794.376644 master llama-server[1969]: 0.00.059.168 I srv  llama_server: initializing ...
1796396796.415734 master llama-server[1969]: 0.02.099.848 I srv  llama_server: model loaded
"""


def test_the_model_load_comes_from_llama_servers_own_clock_where_its_log_has_one():
    assert llama_node.parse_loaded(LOADED_0C1E570, started=1796396790) == 2.1


def test_the_model_load_is_the_journal_time_less_the_start_for_an_older_tree():
    older = "1796396796.5 master llama-server[1969]: main: model loaded\n"
    assert llama_node.parse_loaded(older, started=1796396794) == 2.5
    assert llama_node.parse_loaded(older, started=0) is None
    # Still loading (or rotated away): no figure.
    assert llama_node.parse_loaded("1796396794.3 master llama-server[1969]: loading model\n", 1796396794) is None


def test_a_known_load_of_the_same_process_is_not_read_again():
    known = {"pid": 1969, "load_s": 2.1, "devices": {"RPC0": {"layers": 16, "model_bytes": 1 << 20}}}
    assert llama_node.server_load(1969, 1796396790, known=known) == {"load_s": 2.1, "devices": known["devices"]}


# llama-server 0c1e570's load log with --verbose (short-unix, trimmed): two RPC workers, the second holding the output
# layer; its two RPC buffers both named RPC0, told apart by their endpoints.
LOAD_LOG = """1796396794.1 m llama-server[9]: 0.00.035.007 I llama_prepare_model_devices: using device RPC0 (10.0.0.2:50052) (unknown id) - 24105 MiB free
1796396794.1 m llama-server[9]: 0.00.035.438 I llama_prepare_model_devices: using device RPC1 (10.0.0.3:50052) (unknown id) - 24105 MiB free
""" + "".join(f"1796396794.2 m llama-server[9]: 0.00.069.740 D load_tensors: layer {i:3d} assigned to device "
              f"RPC{0 if i < 16 else 1}, is_swa = 0\n" for i in range(31)) + """1796396794.3 m llama-server[9]: 0.00.091.747 I load_tensors:   CPU_Mapped model buffer size =    31.25 MiB
1796396794.3 m llama-server[9]: 0.00.091.754 I load_tensors: RPC0[10.0.0.2:50052] model buffer size =    40.50 MiB
1796396794.3 m llama-server[9]: 0.00.091.760 I load_tensors: RPC0[10.0.0.3:50052] model buffer size =    38.00 MiB
"""


def test_what_llama_cpp_loaded_per_device_comes_from_its_load_log():
    assert llama_node.parse_devices(LOAD_LOG) == {"RPC0": {"layers": 16, "model_bytes": int(40.5 * MIB)},
                                                  "RPC1": {"layers": 15, "model_bytes": 38 * MIB}}
    # Without --verbose llama.cpp does not log where each layer went: the bytes only.
    quiet = "\n".join(line for line in LOAD_LOG.splitlines() if "assigned" not in line)
    assert llama_node.parse_devices(quiet)["RPC1"] == {"layers": None, "model_bytes": 38 * MIB}
    # A local GPU's buffer is named by the device itself.
    local = ("1 m llama-server[9]: using device CUDA0 (NVIDIA H200) (0000:01:00.0) - 140000 MiB free\n"
             "1 m llama-server[9]: load_tensors:        CUDA0 model buffer size =  1024.00 MiB\n")
    assert llama_node.parse_devices(local) == {"CUDA0": {"layers": None, "model_bytes": 1024 * MIB}}
    assert llama_node.parse_devices("") == {}


def test_status_and_metrics_show_what_was_loaded_beside_the_plan():
    nodes = cluster()
    nodes[0]["status"]["loaded"] = llama_node.parse_devices(LOAD_LOG)
    report = llama_status_report(nodes, now=NOW)
    assert report["healthy"], report["problems"]
    assert "loaded ?" not in report["text"]
    assert row(report["text"], "RPC0") == ["RPC0", "worker1", "0-15", "16", "60", "MiB", "40", "MiB", "80", "MiB"]
    samples = exposition(llama_node.node_metrics(nodes[0]["status"], nodes[0], now=NOW))
    assert samples[("llama_cluster_device_loaded_layers", 'device="RPC1",host="worker2"')] == 15
    assert samples[("llama_cluster_device_loaded_bytes", 'device="RPC0",host="worker1"')] == int(40.5 * MIB)


def test_layers_placed_otherwise_than_planned_are_a_problem_with_the_fix():
    nodes = cluster()
    nodes[0]["status"]["loaded"] = {"RPC0": {"layers": 20, "model_bytes": None},
                                    "RPC1": {"layers": 11, "model_bytes": None}}
    report = llama_status_report(nodes, now=NOW)
    assert not report["healthy"]
    assert "worker1: llama.cpp placed 20 layers on RPC0, the plan 16 (fix: the plan's device order" in report["text"]


def test_the_load_is_exported_on_the_master_only_when_known():
    master = cluster()[0]
    loaded = exposition(llama_node.node_metrics(dict(master["status"], load_s=2.1), master, now=NOW))
    assert loaded[("llama_cluster_model_load_seconds", "")] == 2.1
    loading = exposition(llama_node.node_metrics(dict(master["status"], load_s=None), master, now=NOW))
    assert ("llama_cluster_model_load_seconds", "") not in loading
    worker = cluster()[1]
    assert ("llama_cluster_model_load_seconds", "") not in exposition(
        llama_node.node_metrics(dict(worker["status"], load_s=2.1), dict(worker, master_address="10.0.0.1"), now=NOW))


def test_a_crash_looping_llama_server_is_unhealthy_whatever_its_unit_says():
    """Seen: llama-server crash-looping on a missing model (17 restarts, "active 0s"), no worker held, one request held
    by the front, and status.yml said healthy: its unit was active at the moment of the read. /health says otherwise."""
    nodes = cluster(master_connections=[], connections=[])
    nodes[1]["status"]["connections"] = []
    master = nodes[0]["status"]
    master["units"][0] = dict(unit("llama-server.service", started=NOW), restarts=17)
    master["cmdline"], master["front"] = [], {"held": 1, "sessions": 1}
    master["health"] = {"server": {"url": "http://127.0.0.1:8081/health", "status": None,
                                   "error": "[Errno 111] Connection refused"},
                        "front": {"url": "http://127.0.0.1:8080/health", "status": 503, "error": "Service Unavailable"}}
    report = llama_status_report(nodes, now=NOW)
    assert not report["healthy"]
    assert ("master: llama-server does not serve: its /health answered no answer ([Errno 111] Connection refused) at "
            "http://127.0.0.1:8081/health, and the front holds the API's requests (fix: journalctl -u "
            "llama-server.service says why") in report["text"]
    assert "/health through the front on master: 503 (Service Unavailable)" in report["text"]


def test_a_front_that_does_not_pass_health_is_named_apart_from_llama_server():
    nodes = cluster()
    nodes[0]["status"]["health"] = dict(HEALTH, front={"url": "http://127.0.0.1:8080/health", "status": None,
                                                       "error": "[Errno 111] Connection refused"})
    assert llama_status_report(nodes, now=NOW)["problems"] == [
        "master: the API front does not pass /health: it answered no answer ([Errno 111] Connection refused) at "
        "http://127.0.0.1:8080/health while llama-server answers 200 directly (fix: systemctl status "
        "llama-front.service and journalctl -u llama-front.service say why; site.yml --tags master starts it)"]


def test_requests_held_by_the_front_are_a_problem():
    nodes = cluster()
    nodes[0]["status"]["front"] = {"held": 2, "sessions": 3}
    assert llama_status_report(nodes, now=NOW)["problems"] == [
        "master: the API front holds 2 request(s) (fix: llama-server is not serving them; journalctl -u "
        "llama-server.service)"]


@pytest.fixture
def health_server():
    """A real HTTP server on loopback answering /health as llama-server does: 200, or 503 with its JSON error."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        status = 200

        def do_GET(self):  # noqa: N802 (http.server's name)
            body = b'{"status":"ok"}' if Handler.status == 200 else \
                b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
            self.send_response(Handler.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Handler, f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()


def test_health_is_asked_over_http(health_server):
    handler, url = health_server
    assert llama_node.probe_health(url) == {"url": url, "status": 200, "error": ""}
    handler.status = 503
    assert llama_node.probe_health(url) == {"url": url, "status": 503, "error": "Loading model"}
    closed = url.rsplit(":", 1)[0] + ":9/health"  # discard: nothing listens
    answer = llama_node.probe_health(closed)
    assert answer["status"] is None and "refused" in answer["error"]
    read = llama_node.read_node(install_root="/nonexistent", chrony=False, health={"server": url, "front": ""})
    assert read["health"] == {"server": {"url": url, "status": 503, "error": "Loading model"}}


def test_another_instance_s_units_are_checked_like_the_cluster_s_own():
    """llama_instances' llama-server-NAME and llama-rpc-server-NAME: stopped, or still on the build before an
    upgrade, each is named; the worker watch is not one."""
    nodes = cluster()
    nodes[1]["status"]["units"].append(unit("llama-rpc-server-b.service", build_id="llama.cpp-old"))
    nodes[2]["status"]["units"].append(unit("llama-server-b.service", active="inactive"))
    nodes[0]["status"]["units"].append(unit("llama-server-watch.service", build_id=""))
    problems = llama_status_report(nodes, now=NOW)["problems"]
    assert problems == [
        f"worker1: llama-rpc-server-b.service is set up for llama.cpp-old, not the active build {BUILD['build_id']} "
        f"(fix: site.yml puts a node back on the inventory's build (upgrade.yml when the commit differs))",
        "worker2: llama-server-b.service is inactive, not active (fix: journalctl -u llama-server-b.service says why "
        "it is inactive; systemd restarts it on a crash, site.yml starts it)"]
    # The units table's instance column.
    table = llama_status_table(llama_status_report(nodes, now=NOW), now=NOW)
    rows = {tuple(line.split()[:3]) for line in table}
    assert {("worker1", "llama-rpc-server-b", "b"), ("worker2", "llama-server-b", "b"),
            ("master", "llama-server", "default")} <= rows, table
    assert any(line.split()[:3] == ["master", "llama-server-watch", "active"] for line in table), table
