"""The API front's configuration and Lua gate (role llama_front) as Ansible renders them, run by Debian 12's HAProxy
in the foreground on this machine, in front of a stand-in for llama-server (molecule/shared/stand_in.py, a real HTTP
server on loopback that can be loading, slow, or fail while it runs a request as a crash would). What the cluster scenario shows on a real
llama-server (molecule/cluster/tests/test_front.py), shown here in seconds and on every edge."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "llama_front"
KEY = "test-key-0a1b2c"
HOLD = 16  # three failures of the stand-in (3 s of 503 after each) fit in it, on a loaded machine too


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


STAND_IN = ROOT / "molecule" / "shared" / "stand_in.py"


def control(port, **settings):
    """Set the stand-in's `down` or `slow` (molecule/shared/stand_in.py's /control)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/control", data=json.dumps(settings).encode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def ended_at(port):
    """When the stand-in last finished answering a completion (this machine's monotonic clock)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ended", timeout=10) as response:
        return json.loads(response.read())


def seen(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/seen", timeout=10) as response:
        return json.loads(response.read())


def render(template, dest, extra):
    done = subprocess.run(
        ["ansible", "localhost", "-i", "localhost,", "-c", "local", "-m", "ansible.builtin.template",
         "-a", f"src={ROLE / 'templates' / template} dest={dest}", "-e", f"@{ROLE / 'defaults' / 'main.yml'}",
         "-e", f"@{ROLE / 'vars' / 'main.yml'}", "-e", json.dumps(extra),
         "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")),
        check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def start_front(haproxy, work, api):
    """HAProxy in the foreground with the configuration rendered in `work` (its 503 answer put beside it), once the
    front answers /health on `api` with 200."""
    (work / "503.http").write_bytes((ROLE / "files" / "503.http").read_bytes())
    process = subprocess.Popen([haproxy, "-db", "-f", str(work / "haproxy.cfg")], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while ask(api, "/health")[0] != 200:
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "the front did not serve /health within 20 s"
        time.sleep(0.2)
    return process


@pytest.fixture(scope="module")
def front(tmp_path_factory, haproxy):
    """HAProxy with the front's rendered configuration on a free port, before a stand-in llama-server; its runtime
    directory (the drain's, the admin socket's) is a temporary one."""
    work = tmp_path_factory.mktemp("front")
    run_dir = work / "run"
    run_dir.mkdir()
    api, internal = free_port(), free_port()
    extra = {"llama_server_host": "127.0.0.1", "llama_server_port": api, "llama_server_internal_port": internal,
             "llama_front_hold_seconds": HOLD, "llama_front_retry_after": 7,
             "llama_front_listen": {"enabled": True, "metrics_path": "", "hold_seconds": HOLD, "drain_seconds": 30},
             "llama_metrics_scrape": {"sources": []}, "llama_node": {"address": "127.0.0.1"},
             "llama_server_allowed_sources": [], "llama_api_key": KEY,
             "__llama_front_dir": str(work), "__llama_front_run_dir": str(run_dir),
             "__llama_front_gate": f"unix@{run_dir}/gate.sock"}
    for template in ("haproxy.cfg", "llama-front.lua"):
        render(f"{template}.j2", work / template, extra)
    stand_in = subprocess.Popen([sys.executable, str(STAND_IN), str(internal)])
    process = start_front(haproxy, work, api)
    time.sleep(0.5)  # the gate's probe has seen llama-server healthy
    yield {"port": api, "internal": internal, "run_dir": run_dir, "config": work / "haproxy.cfg"}
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)
    stand_in.terminate()
    stand_in.wait(timeout=10)


def ask(port, path, body=None, key=KEY, timeout=30):
    """(status, JSON body or text, Retry-After) of one request to the front."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text, retry = response.status, response.read().decode(), response.headers["Retry-After"]
    except urllib.error.HTTPError as error:
        status, text, retry = error.code, error.read().decode(), error.headers["Retry-After"]
    except OSError:
        return 0, "", None
    try:
        return status, json.loads(text), retry
    except ValueError:
        return status, text, retry


def message(answer):
    return answer[1]["error"]["message"]


def test_the_key_is_checked_before_any_hold_and_only_its_hash_is_kept(front):
    """llama-server down: a request without the key, or with another, gets the front's 401 at once; X-Api-Key and a
    bare Authorization work as they do for llama-server; /health stays public."""
    control(front["internal"], down=True)
    try:
        time.sleep(0.5)
        for key in (None, "not-the-key"):
            started = time.monotonic()
            answer = ask(front["port"], "/completion", {"prompt": "Hi"}, key=key)
            assert answer[0] == 401 and message(answer) == "Invalid API Key", answer
            assert time.monotonic() - started < 1
        assert ask(front["port"], "/health", key=None)[0] == 503
    finally:
        control(front["internal"], down=False)
    time.sleep(0.5)
    request = urllib.request.Request(f"http://127.0.0.1:{front['port']}/completion", data=b'{"prompt": "Hi"}',
                                     headers={"X-Api-Key": KEY})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    request = urllib.request.Request(f"http://127.0.0.1:{front['port']}/completion", data=b'{"prompt": "Hi"}',
                                     headers={"Authorization": KEY})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert KEY not in front["config"].read_text()


def test_a_held_request_waits_for_llama_server_then_503_with_retry_after(front):
    control(front["internal"], down=True)
    try:
        started = time.monotonic()
        answer = ask(front["port"], "/completion", {"prompt": "Hi"})
        held = time.monotonic() - started
    finally:
        control(front["internal"], down=False)
    assert answer[0] == 503 and answer[2] == "7", answer
    assert f"llama_front_hold_seconds ({HOLD} s)" in message(answer)
    assert HOLD - 0.5 <= held < HOLD + 3, held
    time.sleep(0.5)


def test_only_generation_requests_are_sent_again_and_never_a_fourth_time(front):
    before = seen(front["internal"])
    answer = ask(front["port"], "/slots/0?action=erase", {})
    assert answer[0] == 502 and "not sent again" in message(answer), answer
    # Within FRESH of llama-server's last 200, after the probe saw it fail: a generation sent now must wait for
    # llama-server to be back, not pass into the same failure (that fall would not be counted for it: sent 3 times).
    time.sleep(0.25)
    started = time.monotonic()
    answer = ask(front["port"], "/completion", {"prompt": "fail"})
    assert answer[0] == 502 and "failed three times in a row" in message(answer), answer
    assert time.monotonic() - started < HOLD
    time.sleep(3.5)
    assert ask(front["port"], "/completion", {"prompt": "The capital of France is"})[0] == 200
    after = seen(front["internal"])
    got = {path: count - before.get(path, 0) for path, count in after.items() if count != before.get(path, 0)}
    assert got == {"/slots/0": 1, "/completion": 4}, got  # the failing one three times, the good one once


def drain(front, *args):
    """llama-front-drain against this front, as upgrade.yml runs it (no PID: it only holds and waits)."""
    env = dict(os.environ, LLAMA_FRONT_RUN_DIR=str(front["run_dir"]))
    return subprocess.run([sys.executable, str(ROLE / "files" / "llama-front-drain"), *args], capture_output=True,
                          text=True, timeout=60, check=False, env=env)


def test_a_drain_holds_new_requests_while_those_in_progress_finish(front):
    """llama-front-drain (llama-server's ExecStop) against this front: it waits for the slow request in progress;
    a request sent meanwhile is held, not passed, until the drain ends (--end)."""
    results = {}

    def request(name, prompt):
        started = time.monotonic()
        results[name] = (ask(front["port"], "/completion", {"prompt": prompt}), started, time.monotonic())

    slow = threading.Thread(target=request, args=("slow", "slow"))
    slow.start()
    time.sleep(0.5)  # in progress at llama-server
    started = time.monotonic()
    done = drain(front, "30")
    drained = time.monotonic() - started
    assert done.returncode == 0 and "holding new requests; 1 running" in done.stdout, done.stdout + done.stderr
    slow.join()
    assert results["slow"][0][0] == 200 and 1.0 <= drained < 5, (results, drained)
    held = threading.Thread(target=request, args=("held", "Hi"))
    held.start()
    time.sleep(1.5)
    assert "held" not in results, "a request passed the gate during the drain"
    ended = time.monotonic()
    assert drain(front, "--end").returncode == 0
    held.join()
    assert results["held"][0][0] == 200 and results["held"][2] >= ended, results


def test_a_request_the_gate_passes_as_a_drain_begins_is_waited_for(front):
    """A request sent 50 ms after a drain began (a client starting its next stream): the gate reads the drain file
    every 0.2 s, so it may still pass it. If it does, the drain must count it and wait for its end: a drain that
    counted before the gate held returns at once, and the restart after it cuts that request. Five tries: the gate
    holds the request in about a quarter of them, which shows nothing either way (all five: 1 in 1000)."""
    control(front["internal"], slow=1.0)
    passed = 0
    try:
        for _ in range(5):
            before = seen(front["internal"]).get("/completion", 0)
            process = subprocess.Popen([sys.executable, str(ROLE / "files" / "llama-front-drain"), "30"],
                                       stdout=subprocess.PIPE, text=True,
                                       env=dict(os.environ, LLAMA_FRONT_RUN_DIR=str(front["run_dir"])))
            while not (front["run_dir"] / "drain").exists():
                time.sleep(0.001)
            time.sleep(0.05)
            answered = []
            client = threading.Thread(target=lambda: answered.append((ask(front["port"], "/completion",
                                                                          {"prompt": "slow"})[0], time.monotonic())))
            client.start()
            out, _ = process.communicate(timeout=60)
            returned = time.monotonic()
            time.sleep(0.5)
            reached = seen(front["internal"]).get("/completion", 0) > before
            assert drain(front, "--end").returncode == 0
            client.join()
            assert answered[0][0] == 200, answered
            if reached:
                passed += 1
                # When the stand-in finished answering it (the client, a thread of a loaded machine, may read the
                # answer a little later: what matters is that llama-server had sent all of it).
                ended = ended_at(front["internal"])
                assert ended <= returned, f"the drain returned before a request it let pass ended: {out}"
            time.sleep(0.5)
    finally:
        control(front["internal"], slow=2.0)
    assert passed, "the gate held the request in every try: nothing was shown"
