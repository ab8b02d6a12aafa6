"""The API front (role llama_front, HAProxy on the master): llama-server behind it on loopback; clients see delay,
not errors, while llama-server or a worker restarts, while site.yml restarts llama-server and reloads the front;
a request that meets a llama-server still loading is held until it serves; a stream cut by a crash ends in an error
the client sees; a stream in flight through a planned restart ends whole (the drain); only generation requests are
sent again, never a fourth time; a request without the key is refused at once, never held; /health is never held.
(The API key through the front: test_security.py, whose requests all go through it. The hold's end, 503 with
Retry-After, on this front's configuration: tests/unit/test_front_gate.py.)"""

import json
import time
from shlex import quote

import pytest
from cluster_helpers import (API_KEY, SERVER_PORT, WORKERS, ApiClients, address, drains, http, http_json, journal,
                             listeners, main_pid, monotonic, recap, run_playbook, stand_in, wait_health,
                             wait_restarted)
from suite_report import figures

INTERNAL_PORT = 8081
# A stream (llama-server's SSE) read to its end: after its third event the script kills PID (--kill), or writes
# "streaming" to a file (--mark: the test then knows it is in flight); it prints how the stream ended: "complete"
# (llama-server's final event came) or the client's error. (read1, not readline: http.client's readline takes a
# chunked body cut short for its end.)
STREAM = """
import http.client, json, os, signal, sys
key, n, action, target = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
body = json.dumps({"prompt": "Once upon a time", "n_predict": n, "ignore_eos": True, "stream": True})
connection = http.client.HTTPConnection("127.0.0.1", %d, timeout=30)
connection.request("POST", "/completion", body, {"Content-Type": "application/json", "Authorization": "Bearer " + key})
response = connection.getresponse()
data, acted = b"", False
try:
    while True:
        chunk = response.read1(65536)
        if not chunk:
            break
        data += chunk
        if not acted and data.count(b"data:") >= 3:
            if action == "--kill":
                os.kill(int(target), signal.SIGKILL)
            else:
                open(target, "w").write("streaming")
            acted = True
    end = "complete" if b'"stop":true' in data.replace(b" ", b"") else "no final event"
except Exception as error:
    end = type(error).__name__
print(json.dumps({"status": response.status, "events": data.count(b"data:"), "end": end}))
""" % SERVER_PORT


def test_the_front_takes_the_api_port_and_llama_server_only_loopback(master, workers):
    assert listeners(master, SERVER_PORT) == {f"0.0.0.0:{SERVER_PORT}": "llama-front.service"}
    assert listeners(master, INTERNAL_PORT) == {f"127.0.0.1:{INTERNAL_PORT}": "llama-server.service"}
    args = master.check_output(f"tr '\\0' ' ' < /proc/{main_pid(master, 'llama-server.service')}/cmdline")
    assert f"--host 127.0.0.1 --port {INTERNAL_PORT}" in args
    # From another host: the API answers through the front, llama-server's port is not there.
    probe = ("python3 -c 'import socket, sys; s = socket.socket(); s.settimeout(3); "
             "print(s.connect_ex((sys.argv[1], int(sys.argv[2]))))' {} {}")
    stranger = workers[WORKERS[0]]
    assert stranger.check_output(probe.format(address(master), SERVER_PORT)) == "0"
    assert stranger.check_output(probe.format(address(master), INTERNAL_PORT)) != "0"
    # The package's own haproxy.service (Debian's example configuration) does not run beside the front.
    assert not master.service("haproxy.service").is_running
    assert not master.service("haproxy.service").is_enabled
    # The configuration HAProxy runs is valid, and /health passes through.
    assert master.run("haproxy -c -q -f /etc/llama-front/haproxy.cfg").rc == 0
    assert http(master, SERVER_PORT, "/health", key=None)[0] == 200


def site(*args, tags="master"):
    result = run_playbook("site.yml", "--tags", tags, *args)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def test_no_request_fails_while_the_cluster_restarts(master, workers):
    """One client asking every 0.5 s and 8 concurrent clients, through: llama-server killed, a worker killed,
    site.yml restarting llama-server (a changed setting) and reloading the front (a changed front setting)."""
    worker = workers[WORKERS[0]]
    front = main_pid(master, "llama-front.service")
    with ApiClients(master) as clients:
        # Each kill ends in a new llama-server (systemd, or the watch), which then serves; then a few seconds more
        # of the event's window.
        pid = main_pid(master, "llama-server.service")
        clients.event("llama-server killed (SIGKILL)")
        master.check_output(f"kill -KILL {pid}")
        wait_restarted(master, pid)
        wait_health(master, SERVER_PORT)
        time.sleep(4)
        pid = main_pid(master, "llama-server.service")
        clients.event("worker1's RPC server killed (SIGKILL)")
        worker.check_output(f"kill -KILL {main_pid(worker, 'llama-rpc-server.service')}")
        wait_restarted(master, pid)
        wait_health(master, SERVER_PORT)
        time.sleep(4)
        pid = main_pid(master, "llama-server.service")
        clients.event("site.yml: a setting changed, front reloaded")
        output = site("-e", json.dumps({"llama_server_batch_size": 1024, "llama_front_retry_after": 11}))
        assert recap(output)["master"]["changed"] > 0
        assert main_pid(master, "llama-server.service") != pid  # the event restarted llama-server
        time.sleep(5)
    clients.report("through the front (SmolLM2 over two workers):")
    clients.assert_none_failed()
    # Held, not hung: the restarts' work (stop within TimeoutStopSec, workers, model load) takes seconds here; a
    # request held as long as systemd's 90 s stop timeout (llama-server under load never ends on SIGTERM) fails this.
    assert max(clients.longest().values()) < 30, clients.longest()
    # And held: a kill is at least systemd's RestartSec (1 s) without llama-server, and the requests in flight at it
    # or sent meanwhile waited that long rather than fail.
    assert clients.longest()["llama-server killed (SIGKILL)"] >= 0.9, clients.longest()
    # The front was reloaded (HAProxy's master process re-executed itself), never restarted.
    assert main_pid(master, "llama-front.service") == front
    assert "Reloaded" in master.check_output("journalctl -o cat -u llama-front.service _PID=1")


def test_the_master_waits_for_a_missing_worker_a_bounded_time_then_again(master, workers):
    """llama_server_worker_wait_timeout reaches the unit: with a worker's RPC server stopped, llama-server's
    ExecStartPre gives up after that long, naming the worker, and systemd tries again (never stuck in one 300 s wait);
    once the worker is back, the next try serves. (site.yml at its defaults afterwards.)"""
    worker, name = workers[WORKERS[1]], WORKERS[1]
    try:
        site("-e", "llama_server_worker_wait_timeout=3")
        assert " 3 " in master.check_output("systemctl show -p ExecStartPre --value llama-server.service")
        since = master.check_output("date '+%Y-%m-%d %H:%M:%S'")
        worker.check_output("systemctl stop llama-rpc-server.service")
        master.check_output("systemctl restart --no-block llama-server.service")
        deadline, given_up = time.monotonic() + 60, []
        while len(given_up) < 2 and time.monotonic() < deadline:
            time.sleep(1)
            log = journal(master, "llama-server.service", since)
            given_up = [line for line in log.splitlines() if "giving up" in line]
        assert len(given_up) >= 2, log
        assert all(f"llama-wait-workers: worker {name} (" in line and "no answer to the RPC handshake" in line
                   and "for 3s; giving up: is its RPC server running?" in line for line in given_up), given_up
        assert http(master, SERVER_PORT, "/health", key=None)[0] != 200
        worker.check_output("systemctl start llama-rpc-server.service")
        wait_health(master, SERVER_PORT)
        answer = http_json(master, SERVER_PORT, "/completion", {"prompt": "Hello", "n_predict": 2, "temperature": 0})
        assert answer["tokens_predicted"] == 2
    finally:
        worker.check_output("systemctl start llama-rpc-server.service")
        site()
    assert " 300 " in master.check_output("systemctl show -p ExecStartPre --value llama-server.service")
    wait_health(master, SERVER_PORT)


def test_a_stream_cut_by_a_crash_ends_in_an_error_the_client_sees(master):
    wait_health(master, SERVER_PORT)
    pid = main_pid(master, "llama-server.service")
    result = json.loads(master.check_output(f"python3 -c {quote(STREAM)} {quote(API_KEY)} 400 --kill {pid}"))
    assert result["status"] == 200 and result["events"] >= 3
    # Cut, and seen as cut at once: not a socket timeout (30 s) that any hung stream would also end in.
    assert result["end"] in ("IncompleteRead", "ProtocolError", "ConnectionResetError", "RemoteDisconnected"), result
    wait_health(master, SERVER_PORT)


# llama-server as the front sees it in the instant after a fast restart (an idle llama-server stops in 40 ms and the
# new one listens 130 ms later, loading: seen in 1 of 6 model switches here): /health answered 200 a moment ago, then
# every request answered with llama-server's 503 "Loading model" for LOADING s, then served. A stand-in on the
# internal port makes that instant happen on every run: the first completion starts the "load".
LOADING = 2.0


def test_a_request_that_meets_llama_server_loading_is_held_until_it_serves(master):
    """The gate holds every request from llama-server's first 503 "Loading model" on, until a /health probe begun
    after it is answered 200: the 200 of the process before is no longer fresh enough. (Before: the front's retries
    all passed the gate within its 0.5 s freshness, and the client got the 503 within 30 ms.)"""
    with stand_in(master, INTERNAL_PORT, "--loading", str(LOADING)):
        wait_health(master, SERVER_PORT)  # the gate has seen it healthy
        time.sleep(0.3)
        started = time.monotonic()
        status, text = http(master, SERVER_PORT, "/completion", {"prompt": "The capital of France is"})
        held = time.monotonic() - started
    assert status == 200, text
    assert LOADING <= held < LOADING + 5, held
    wait_health(master, SERVER_PORT)


@pytest.fixture
def stopped(master):
    """llama-server stopped while the test runs, then started again."""
    master.check_output("systemctl stop llama-server.service")
    yield
    master.check_output("systemctl start llama-server.service")
    wait_health(master, SERVER_PORT)


def test_a_request_without_the_key_is_refused_at_once_even_while_llama_server_is_down(master, stopped):
    """Held slots are the key holders': with llama-server stopped, a request without the key (or with another) gets
    the front's own 401 at once, never a place in the hold; the front's configuration has the key's hash only."""
    for key in (None, "not-the-key"):
        started = time.monotonic()
        status, text = http(master, SERVER_PORT, "/completion", {"prompt": "Hi", "n_predict": 1}, timeout=30, key=key)
        assert status == 401 and json.loads(text)["error"]["message"] == "Invalid API Key", (status, text)
        assert time.monotonic() - started < 2
    assert API_KEY not in master.check_output("cat /etc/llama-front/haproxy.cfg")


def test_health_is_not_held_and_says_when_to_try_again(master, stopped):
    """/health while llama-server is down: 503 at once, with Retry-After (llama_front_retry_after). A request held
    for all of llama_front_hold_seconds gets the same 503 with the reason: tests/unit/test_front_gate.py, on this
    front's configuration with a hold of seconds (a hold that short is refused here: the model's load takes longer)."""
    started = time.monotonic()
    reply = master.check_output(
        "python3 -c 'import sys, urllib.request, urllib.error\n"
        "try:\n urllib.request.urlopen(sys.argv[1], timeout=10)\n"
        "except urllib.error.HTTPError as e:\n print(e.code, e.headers[\"Retry-After\"])' "
        f"http://127.0.0.1:{SERVER_PORT}/health")
    assert reply.split() == ["503", "10"], reply
    assert time.monotonic() - started < 3


def test_only_generation_requests_are_sent_again_and_one_failing_three_times_is_not(master):
    """A request that is not a generation (/slots/0?action=erase) is sent once: llama-server failing while it runs
    it is its client's 502, saying it may have taken effect. A generation is sent again after a failure, but one in
    flight at three failures in a row is not sent a fourth time: its client gets a 502 that says why, and every other
    client is served meanwhile. (molecule/shared/stand_in.py on llama-server's port: no request of the pinned trees
    is known to crash llama-server.)"""
    with stand_in(master, INTERNAL_PORT):
        wait_health(master, SERVER_PORT)
        status, text = http(master, SERVER_PORT, "/slots/0?action=erase", {}, timeout=60)
        assert status == 502 and "not sent again" in json.loads(text)["error"]["message"], (status, text)
        status, text = http(master, SERVER_PORT, "/completion", {"prompt": "fail"}, timeout=60)
        assert status == 502 and "failed three times in a row" in json.loads(text)["error"]["message"], (status, text)
        status, text = http(master, SERVER_PORT, "/completion", {"prompt": "The capital of France is"}, timeout=60)
        assert status == 200, (status, text)
        seen = json.loads(http(master, INTERNAL_PORT, "/seen", key=None)[1])
    assert seen == {"/slots/0": 1, "/completion": 4}, seen  # the failing one three times, the good one once
    wait_health(master, SERVER_PORT)


def test_a_stream_in_flight_through_a_planned_restart_ends_whole(master, workers):
    """site.yml with a changed setting restarts llama-server (its MainPID changes) while 400-token streams run back
    to back: the restart drains first (llama_front_drain_seconds, 60 by default), the stream in flight then ends
    whole, then llama-server restarts."""
    wait_health(master, SERVER_PORT)
    before = main_pid(master, "llama-server.service")
    with ApiClients(master, groups=(ApiClients.STREAMS,)) as clients:
        since = monotonic(master)
        clients.event("site.yml: a setting changed")
        output = site("-e", "llama_server_batch_size=1536")
        time.sleep(3)
    after = main_pid(master, "llama-server.service")
    assert after != before and "RUNNING HANDLER [llamacpp.rpc_cluster.llama_server : Restart llama-server]" in output
    clients.assert_none_failed()
    drained = drains(master, since)
    clients.assert_streamed_through(drained)
    wait_health(master, SERVER_PORT)
    site()
    figures("a planned restart drains first", [
        f"a 400-token stream in flight through site.yml's restart ended whole; the drain waited "
        f"{drained[0][1] - drained[0][0]:.1f} s for it"])
