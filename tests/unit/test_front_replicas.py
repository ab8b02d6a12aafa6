"""The API front with two replicas of one model and another model (llama_instances, docs/instances.md), as Ansible
renders it, run by Debian 12's HAProxy on this machine before three stand-ins for llama-server
(molecule/shared/stand_in.py): requests are routed by their `model`, balanced over the replicas, sent to the other
replica at once when one is down, and a replica drained for a planned restart (llama-front-drain --server) finishes
what it runs while the other takes every new request, nothing held."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from test_front_gate import KEY, ROLE, STAND_IN, ask, control, free_port, render, seen, start_front

HOLD = 16


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, haproxy):
    work = tmp_path_factory.mktemp("replicas")
    run_dir = work / "run"
    run_dir.mkdir()
    api, own, replica, other = free_port(), free_port(), free_port(), free_port()
    instances = [
        {"index": 0, "name": "default", "served_name": "smollm2", "master": "localhost", "port": own,
         "backend": "llama_server", "server": "llama-server"},
        {"index": 1, "name": "b", "served_name": "smollm2", "master": "localhost", "port": replica,
         "backend": "llama_server", "server": "b"},
        {"index": 2, "name": "tiny", "served_name": "tiny", "master": "localhost", "port": other,
         "backend": "llama_server_tiny", "server": "tiny"}]
    extra = {"llama_server_host": "127.0.0.1", "llama_server_port": api, "llama_server_internal_port": own,
             "llama_front_hold_seconds": HOLD, "llama_front_retry_after": 7,
             "llama_front_listen": {"enabled": True, "metrics_path": "", "hold_seconds": HOLD, "drain_seconds": 30},
             "llama_metrics_scrape": {"sources": []}, "llama_node": {"address": "127.0.0.1"},
             "llama_server_allowed_sources": [], "llama_api_key": KEY, "llama_server_instance_list": instances,
             "__llama_front_addresses": {}, "__llama_front_dir": str(work), "__llama_front_run_dir": str(run_dir),
             "__llama_front_gate": f"unix@{run_dir}/gate.sock"}
    for template in ("haproxy.cfg", "llama-front.lua"):
        render(f"{template}.j2", work / template, extra)
    stand_ins = [subprocess.Popen([sys.executable, str(STAND_IN), str(port)]) for port in (own, replica, other)]
    process = start_front(haproxy, work, api)
    time.sleep(1.5)  # the gate's probes and HAProxy's health checks have seen every stand-in serve
    yield {"port": api, "own": own, "replica": replica, "other": other, "run_dir": run_dir}
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)
    for stand_in in stand_ins:
        stand_in.terminate()
        stand_in.wait(timeout=10)


def stat(run_dir, server, column):
    """A column of the model's backend (llama_server), or of one of its servers, in HAProxy's `show stat`."""
    with socket.socket(socket.AF_UNIX) as admin:
        admin.connect(str(run_dir / "admin.sock"))
        admin.sendall(b"show stat\n")
        data = b""
        while chunk := admin.recv(65536):
            data += chunk
    lines = data.decode().splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line]
    return next(row[column] for row in rows if row["pxname"] == "llama_server" and row["svname"] == server)


def refused(run_dir):
    """The 5xx answers of the model's backend so far: a backend without a server to take a request answers 503
    itself (hrsp_5xx)."""
    return int(stat(run_dir, "BACKEND", "hrsp_5xx") or 0)


def wait_status(replicas, status, server="b"):
    """Until HAProxy's health check, and then the gate's probe, have seen `server` DOWN or UP."""
    deadline = time.monotonic() + 20
    while not stat(replicas["run_dir"], server, "status").startswith(status):
        assert time.monotonic() < deadline, f"HAProxy did not see {server} {status} within 20 s"
        time.sleep(0.1)
    time.sleep(0.5)  # the gate's probe (every 0.2 s) and its FRESH (0.5 s)


def completions(port):
    return seen(port).get("/completion", 0)


def test_requests_go_by_model_and_the_replicas_share_them(replicas):
    before = {name: completions(replicas[name]) for name in ("own", "replica", "other")}
    for _ in range(6):
        assert ask(replicas["port"], "/completion", {"prompt": "Hi", "model": "smollm2"})[0] == 200
        assert ask(replicas["port"], "/completion", {"prompt": "Hi"})[0] == 200  # no model: the cluster's own
    assert ask(replicas["port"], "/completion", {"prompt": "Hi", "model": "tiny"})[0] == 200
    got = {name: completions(replicas[name]) - count for name, count in before.items()}
    assert got["other"] == 1 and got["own"] + got["replica"] == 12 and min(got["own"], got["replica"]) >= 3, got
    status, answer, _ = ask(replicas["port"], "/completion", {"prompt": "Hi", "model": "gpt-4"})
    assert status == 404 and "it serves smollm2, tiny" in answer["error"]["message"], answer
    listed = ask(replicas["port"], "/v1/models")[1]
    assert [model["id"] for model in listed["data"]] == ["smollm2", "tiny"], listed


def test_a_replica_down_holds_nothing(replicas):
    control(replicas["replica"], down=True)
    try:
        wait_status(replicas, "DOWN")
        before = completions(replicas["own"])
        started = time.monotonic()
        for _ in range(6):
            assert ask(replicas["port"], "/completion", {"prompt": "Hi", "model": "smollm2"})[0] == 200
        assert time.monotonic() - started < 3 and completions(replicas["own"]) - before == 6
    finally:
        control(replicas["replica"], down=False)
    wait_status(replicas, "UP")


def drain(run_dir, *args):
    env = dict(os.environ, LLAMA_FRONT_RUN_DIR=str(run_dir))
    return subprocess.run([sys.executable, str(ROLE / "files" / "llama-front-drain"), *args], capture_output=True,
                          text=True, timeout=60, check=False, env=env)


def test_a_drained_replica_finishes_its_request_while_the_other_takes_the_new_ones(replicas):
    """llama-front-drain --server llama_server/b: b's slow request ends whole; meanwhile every new request goes to
    the cluster's own llama-server at once (none held, none to b); --end gives b requests again."""
    control(replicas["replica"], slow=2.0)
    control(replicas["own"], slow=2.0)
    before = completions(replicas["replica"])
    slow = []
    clients = [threading.Thread(target=lambda: slow.append(ask(replicas["port"], "/completion",
                                                               {"prompt": "slow", "model": "smollm2"})))
               for _ in range(2)]
    for client in clients:  # leastconn: one on each replica
        client.start()
    time.sleep(0.5)
    assert completions(replicas["replica"]) == before + 1, "b does not run one of the slow requests"
    own, replica = completions(replicas["own"]), completions(replicas["replica"])
    started = time.monotonic()
    done = drain(replicas["run_dir"], "--server", "llama_server/b", "30")
    waited = time.monotonic() - started
    assert done.returncode == 0 and "llama_server/b drained in" in done.stdout, done.stdout + done.stderr
    assert 0.5 < waited < 5, waited
    try:
        for _ in range(4):
            begun = time.monotonic()
            assert ask(replicas["port"], "/completion", {"prompt": "Hi", "model": "smollm2"})[0] == 200
            assert time.monotonic() - begun < 1.5  # not held: the other replica serves
        assert completions(replicas["replica"]) == replica and completions(replicas["own"]) >= own + 4
    finally:
        assert drain(replicas["run_dir"], "--server", "llama_server/b", "--end").returncode == 0
    for client in clients:
        client.join()
    assert [answer[0] for answer in slow] == [200, 200], slow
    before = completions(replicas["replica"])
    for _ in range(6):
        ask(replicas["port"], "/completion", {"prompt": "Hi", "model": "smollm2"})
    assert completions(replicas["replica"]) > before, "b took no request after --end"


def test_a_request_waits_while_its_only_serving_replica_is_drained(replicas):
    """b down, the cluster's own drained: no replica takes requests, so the gate holds them (instead of passing them
    to a backend without a server, a 503); --end lets them through."""
    control(replicas["replica"], down=True)
    try:
        wait_status(replicas, "DOWN")
        assert drain(replicas["run_dir"], "--server", "llama_server/llama-server", "5").returncode == 0
        before = refused(replicas["run_dir"])
        ended = []
        # (when --end began, its result): it returns once HAProxy's check sees llama-server back, maybe after the answer.
        threading.Timer(2.0, lambda: ended.append((time.monotonic(), drain(replicas["run_dir"], "--server",
                                                                           "llama_server/llama-server", "--end"))))\
            .start()
        answer = ask(replicas["port"], "/completion", {"prompt": "Hi", "model": "smollm2"})
        answered = time.monotonic()
        assert answer[0] == 200, answer
        assert ended and ended[0][1].returncode == 0 and answered >= ended[0][0], "answered before the drain ended"
        assert refused(replicas["run_dir"]) == before, "the gate passed it to a backend with no server to take it"
    finally:
        control(replicas["replica"], down=False)
        drain(replicas["run_dir"], "--server", "llama_server/llama-server", "--end")
    wait_status(replicas, "UP")


def test_a_planned_stop_of_the_cluster_s_own_llama_server_drains_it_alone(replicas):
    """llama-server's ExecStop (llama-front-drain SECONDS PID) while replica b serves: only llama-server is drained
    (no hold: every request sent meanwhile goes to b at once), then the process is stopped; its ExecStopPost
    (--end) puts it back in service."""
    wait_status(replicas, "UP")
    process = subprocess.Popen(["sleep", "60"])
    try:
        done = drain(replicas["run_dir"], "30", str(process.pid))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "another replica of the model serves (b)" in done.stdout and "llama_server/llama-server drained in" \
            in done.stdout, done.stdout
        assert process.wait(timeout=10) is not None
        assert stat(replicas["run_dir"], "llama-server", "status").startswith("DRAIN")
        before = completions(replicas["replica"])
        for _ in range(4):
            begun = time.monotonic()
            assert ask(replicas["port"], "/completion", {"prompt": "Hi", "model": "smollm2"})[0] == 200
            assert time.monotonic() - begun < 1.5
        assert completions(replicas["replica"]) == before + 4
    finally:
        process.kill()
        assert drain(replicas["run_dir"], "--end").returncode == 0
    assert stat(replicas["run_dir"], "llama-server", "status").startswith("UP")
    assert not (replicas["run_dir"] / "drain").exists()  # never held
