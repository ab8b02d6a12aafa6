"""The API front (role llama_front, HAProxy on the master): llama-server behind it on loopback; clients see delay,
not errors, while llama-server or a worker restarts, while site.yml restarts llama-server and reloads the front;
a request that meets a llama-server still loading is held until it serves; a stream cut by a crash ends in an error
the client sees; after llama_front_hold_seconds the front answers 503 with Retry-After, and /health is never held.
(The API key through the front: test_security.py, whose requests all go through it.)"""

import json
import time
from shlex import quote

import pytest
from cluster_helpers import (API_KEY, SERVER_PORT, WORKERS, ApiClients, address, http, http_json, listeners, main_pid,
                             recap, run_playbook, wait_health, wait_restarted)

INTERNAL_PORT = 8081
# A stream (llama-server's SSE) read until its third event, when the script kills llama-server; then it reads on
# and prints how the stream ended: "complete" (the final chunk came) or the client's error. (read1, not readline:
# http.client's readline takes a chunked body cut short for its end.)
STREAM = """
import http.client, json, os, signal, sys
key, pid = sys.argv[1], int(sys.argv[2])
body = json.dumps({"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True, "stream": True})
connection = http.client.HTTPConnection("127.0.0.1", %d, timeout=120)
connection.request("POST", "/completion", body, {"Content-Type": "application/json", "Authorization": "Bearer " + key})
response = connection.getresponse()
data, killed = b"", False
try:
    while True:
        chunk = response.read1(65536)
        if not chunk:
            break
        data += chunk
        if not killed and data.count(b"data:") >= 3:
            os.kill(pid, signal.SIGKILL)
            killed = True
    print(json.dumps({"status": response.status, "events": data.count(b"data:"), "end": "complete"}))
except Exception as error:
    print(json.dumps({"status": response.status, "events": data.count(b"data:"), "end": type(error).__name__}))
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
        clients.event("site.yml: a setting changed, front reloaded")
        output = site("-e", json.dumps({"llama_server_batch_size": 1024, "llama_front_retry_after": 11}))
        assert recap(output)["master"]["changed"] > 0
        time.sleep(5)
    clients.report("through the front (SmolLM2 over two workers):")
    clients.assert_none_failed()
    # Held, not hung: the restarts' work (stop within TimeoutStopSec, workers, model load) takes seconds here; a
    # request held as long as systemd's 90 s stop timeout (llama-server under load never ends on SIGTERM) fails this.
    assert max(clients.longest().values()) < 30, clients.longest()
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
            log = master.check_output(f"journalctl -o cat -u llama-server.service --since '{since}'")
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
    result = json.loads(master.check_output(f"python3 -c {quote(STREAM)} {quote(API_KEY)} {pid}"))
    assert result["status"] == 200 and result["events"] >= 3
    assert result["end"] != "complete", result
    wait_health(master, SERVER_PORT)


# llama-server as the front sees it in the instant after a fast restart (an idle llama-server stops in 40 ms and the
# new one listens 130 ms later, loading: seen in 1 of 6 model switches here): /health answered 200 a moment ago, then
# every request answered with llama-server's 503 "Loading model" for LOADING s, then served. A stand-in on the
# internal port makes that instant happen on every run: the first completion starts the "load".
LOADING = 2.0
RESTARTED = """
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
LOADING, began, lock = float(sys.argv[2]), [None], threading.Lock()
class Handler(BaseHTTPRequestHandler):
    def answer(self, completion):
        with lock:
            if completion and began[0] is None:
                began[0] = time.monotonic()
            loading = began[0] is not None and time.monotonic() - began[0] < LOADING
        if loading:
            status, body = 503, {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
        else:
            status, body = 200, {"content": " Paris", "tokens_predicted": 1} if completion else {"status": "ok"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.answer(False)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer(True)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_request_that_meets_llama_server_loading_is_held_until_it_serves(master):
    """The gate holds every request from llama-server's first 503 "Loading model" on, until a /health probe begun
    after it is answered 200: the 200 of the process before is no longer fresh enough. (Before: the front's retries
    all passed the gate within its 0.5 s freshness, and the client got the 503 within 30 ms.)"""
    master.check_output("systemctl stop llama-server.service")
    stand_in = master.run(f"nohup python3 -c {quote(RESTARTED)} {INTERNAL_PORT} {LOADING} >/dev/null 2>&1 & echo $!")
    try:
        wait_health(master, SERVER_PORT)  # the gate has seen it healthy
        time.sleep(0.3)
        started = time.monotonic()
        status, text = http(master, SERVER_PORT, "/completion", {"prompt": "The capital of France is"})
        held = time.monotonic() - started
    finally:
        master.run(f"kill {stand_in.stdout.strip()}")
        master.check_output("systemctl start llama-server.service")
    assert status == 200, text
    assert LOADING <= held < LOADING + 5, held
    wait_health(master, SERVER_PORT)


@pytest.fixture
def short_hold(master):
    """The front with a 3 s hold (its role's tag: the front alone) and llama-server stopped; afterwards site.yml
    puts the master back as the inventory says (the hold, and the batch size of the test before)."""
    output = site("-e", "llama_front_hold_seconds=3", tags="llama_front")
    assert recap(output)["master"]["changed"] > 0
    master.check_output("systemctl stop llama-server.service")
    yield
    site()
    wait_health(master, SERVER_PORT)


def test_after_the_hold_the_front_answers_503_with_retry_after(master, short_hold):
    started = time.monotonic()
    reply = master.check_output(
        "python3 -c 'import sys, urllib.request, urllib.error\n"
        "try:\n urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b\"{}\"), timeout=60)\n"
        "except urllib.error.HTTPError as e:\n print(e.code, e.headers[\"Retry-After\"], e.read().decode())' "
        f"http://127.0.0.1:{SERVER_PORT}/completion")
    held = time.monotonic() - started
    status, retry_after, body = reply.split(" ", 2)
    assert (status, retry_after) == ("503", "10")
    assert "llama_front_hold_seconds (3 s)" in json.loads(body)["error"]["message"]
    assert 3 <= held < 30
    # /health is not held: 503 at once, with Retry-After too.
    started = time.monotonic()
    assert http(master, SERVER_PORT, "/health", key=None)[0] == 503
    assert time.monotonic() - started < 3
