"""playbooks/status.yml on the running cluster: read-only (check mode reports no change), one row per node with the
plan's devices, what llama.cpp loaded onto each and what each RPC server holds, `healthy`; with a worker's RPC server stopped it fails and names the
worker, the unit and the master that serves without it, with the fixes; the JSON report says the same."""

import json
import re

import pytest
from cluster_helpers import SERVER_PORT, WORKERS, address, recap, run_playbook, wait_health


def status(*args):
    result = run_playbook("playbooks/status.yml", *args, timeout=300)
    return result, result.stdout + result.stderr


def test_a_healthy_cluster_in_check_mode(master, workers, tmp_path):
    report_file = tmp_path / "status.json"
    result, output = status("--check", "-e", f"status_file={report_file}")
    assert result.returncode == 0, output[-4000:]
    assert all(counts["changed"] == 0 for counts in recap(output).values()), output[-3000:]
    report = json.loads(report_file.read_text())
    assert report["healthy"] and report["problems"] == [] and report["text"].splitlines()[-1] == "healthy"
    rows = {row["host"]: row for row in report["nodes"]}
    assert set(rows) == {"master", *WORKERS}
    for name in WORKERS:
        assert rows[name]["address"] == address(workers[name]) and rows[name]["connected"] is True
        assert rows[name]["devices"], rows[name]
        held = next(unit["memory_bytes"] for unit in rows[name]["units"] if unit["name"] == "llama-rpc-server.service")
        assert held >= sum(device["planned_bytes"] for device in rows[name]["devices"]) // 2, rows[name]
    # The plan's devices, in llama.cpp's order, over the workers: every layer and the output layer placed once.
    planned = sorted((device["name"], device["layers"]) for row in rows.values() for device in row["devices"])
    assert [name for name, _ in planned] == [f"RPC{index}" for index in range(len(planned))]
    assert planned[-1][1].endswith("+out")
    # What llama.cpp loaded (its load log; this scenario's llama-server runs with --verbose, which logs each layer's
    # device): the plan's layers on each device, and some of the model's weights on each.
    for device in (device for row in rows.values() for device in row["devices"]):
        assert device["layers_loaded"] == device["planned_layers"], device
        assert 0 < device["loaded_bytes"] <= device["planned_bytes"], device
    assert re.search(r"^model: /srv/models/cluster\.gguf, sha256 [0-9a-f]{12}, stage mode", report["text"], re.M)
    # How long the running llama-server took to load the model, from its journal.
    assert 0 < report["model"]["load_s"] < 180, report["model"]
    assert re.search(r"^model: .*, loaded in \d+\.\d s$", report["text"], re.M), report["text"]


def test_a_stopped_worker_is_named_with_the_fix(master, workers):
    worker = workers["worker2"]
    worker.check_output("systemctl stop llama-rpc-server.service")
    try:
        result, output = status("-e", "status_format=json")
    finally:
        worker.check_output("systemctl start llama-rpc-server.service")
    assert result.returncode != 0, output[-3000:]
    assert "worker2: llama-rpc-server.service is inactive, not active (fix: journalctl -u llama-rpc-server.service" \
        in output, output[-4000:]
    # llama-server lost the worker: it is down or back without it (the watch restarts it once the worker answers).
    assert re.search(r"master: llama-server(\.service is \w+, not active| serves without worker2 \([\d.]+:\d+\))",
                     output), output[-4000:]
    wait_health(master, SERVER_PORT, timeout=180)


def test_healthy_again_once_the_worker_is_back(master):
    wait_health(master, SERVER_PORT, timeout=180)
    result, output = status()
    assert result.returncode == 0, output[-4000:]
