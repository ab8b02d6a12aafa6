"""playbooks/status.yml on the cluster over mutual TLS: read-only and healthy; each worker's terminator is listed and
active, the master holds each worker's connection (through the terminator, at the worker's public RPC address) and
llama-server every local TLS client endpoint of its --rpc; with a worker's terminator stopped the status fails and
names the worker, the unit and the fix."""

import json

from cluster_helpers import SERVER_PORT, WORKERS, recap, run_playbook, wait_health

TERMINATOR = "llama-rpc-tls.service"
CLIENTS = "llama-rpc-tls-clients.service"


def status(tmp_path, *args):
    report_file = tmp_path / "status.json"
    result = run_playbook("playbooks/status.yml", "--check", "-e", f"status_file={report_file}", *args, timeout=300)
    output = result.stdout + result.stderr
    return result, output, json.loads(report_file.read_text()) if report_file.exists() else None


def units(row):
    return {unit["name"]: unit["state"] for unit in row["units"]}


def test_a_healthy_tls_cluster(master, workers, tmp_path):
    result, output, report = status(tmp_path)
    assert result.returncode == 0, output[-4000:]
    assert all(counts["changed"] == 0 for counts in recap(output).values()), output[-3000:]
    assert report["healthy"] and report["problems"] == [], report["problems"]
    rows = {row["host"]: row for row in report["nodes"]}
    for name in WORKERS:
        assert rows[name]["connected"] is True, rows[name]
        assert units(rows[name])[TERMINATOR] == "active", rows[name]["units"]
        assert rows[name]["devices"], rows[name]
    assert units(rows["master"])[CLIENTS] == "active", rows["master"]["units"]
    assert f"worker1  {TERMINATOR.removesuffix('.service')}" in report["text"]


def test_a_stopped_terminator_is_named_with_the_fix(master, workers, tmp_path):
    worker = workers["worker2"]
    worker.check_output(f"systemctl stop {TERMINATOR}")
    try:
        result, output, report = status(tmp_path)
    finally:
        worker.check_output(f"systemctl start {TERMINATOR}")
    assert result.returncode != 0, output[-3000:]
    assert not report["healthy"], report
    assert any(problem.startswith(f"worker2: {TERMINATOR} is inactive (fix: systemctl status {TERMINATOR}")
               for problem in report["problems"]), report["problems"]
    # The master serves again through the terminator once it listens (the watch restarts llama-server).
    wait_health(master, SERVER_PORT, timeout=180)
