"""The continuity tests' own guards (molecule/shared/api_clients.py and cluster_helpers.ApiClients), each shown to
fail on what it guards against: a stream cut short or ended without its final event is a failed request, a client
run that sent nothing fails, the requests in flight at an event are measured with it, and a stream counts as in
flight at a drain only while it runs. The clients run for real, against a local HTTP server that answers as
llama-server does (non-streamed completions, and SSE streams that end whole, or are cut)."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "molecule" / "shared"
sys.path.insert(0, str(SHARED))
from cluster_helpers import ApiClients  # noqa: E402  # pylint: disable=wrong-import-position


class LlamaServer(BaseHTTPRequestHandler):
    """/completion as llama-server answers it; a stream follows the server's `mode`: "whole" (every token, then the
    final event), "merged" (the same, but two tokens in one event, as llama-server sends a token that ends inside a
    UTF-8 character with the next), "cut" (the connection closed after 3 events), "no final" (every token, no final
    event)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.asked += 1
        if not body.get("stream"):
            answer = json.dumps({"content": " Paris", "tokens_predicted": body["n_predict"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            return
        mode = self.server.mode
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = {"cut": 3, "merged": body["n_predict"] - 1}.get(mode, body["n_predict"])
        for index in range(events):
            self.chunk(f"data: {json.dumps({'content': 'a', 'stop': False, 'index': index})}\n\n")
        if mode == "cut":
            self.wfile.flush()
            self.connection.shutdown(2)  # the stream ends without its last chunk
            return
        if mode in ("whole", "merged"):
            final = {"content": "", "stop": True, "tokens_predicted": body["n_predict"]}
            self.chunk(f"data: {json.dumps(final)}\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def chunk(self, text):
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def log_message(self, *_):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), LlamaServer)
    httpd.mode = "whole"
    httpd.asked = 0  # requests received
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def run_clients(server, tmp_path, clients, interval, tokens, seconds=1.0):
    """api_clients.py, as ApiClients runs it on a host, for `seconds` after its first request: its requests. (Timed
    from its start, a loaded host's clients once sent nothing in the 0.5 s given: still starting Python.)"""
    stop = tmp_path / f"stop-{time.monotonic_ns()}"
    asked = server.asked
    process = subprocess.Popen([sys.executable, str(SHARED / "api_clients.py"), f"http://127.0.0.1:{server.server_port}",
                                str(clients), str(interval), str(stop), "key", str(tokens)],
                               stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while server.asked == asked and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(seconds)
    stop.touch()
    out, _ = process.communicate(timeout=60)
    return json.loads(out)


@pytest.mark.parametrize("mode", ["whole", "merged"])
def test_completions_and_whole_streams_are_answered(server, tmp_path, mode):
    """A whole stream is one that ends with llama-server's final event, which counts every token asked for; there
    may be fewer events than tokens (seen: 398 and 399 events for 400 tokens)."""
    server.mode = mode
    assert all(r[2] == 200 and not r[3] for r in run_clients(server, tmp_path, 2, 0.1, 0))
    streams = run_clients(server, tmp_path, 1, 0.0, 400)
    assert streams and all(r[2] == 200 and not r[3] for r in streams), streams


@pytest.mark.parametrize("mode, error", [("cut", "stream cut after 3 events: "),
                                         ("no final", "stream ended after 400 events without llama-server's final")])
def test_a_stream_not_ended_whole_is_a_failed_request(server, tmp_path, mode, error):
    server.mode = mode
    streams = run_clients(server, tmp_path, 1, 0.0, 400, seconds=0.5)
    assert streams and all(r[3].startswith(error) for r in streams), streams
    clients = ApiClients(None, groups=(ApiClients.STREAMS,))
    clients.results = {ApiClients.STREAMS[0]: streams}
    with pytest.raises(AssertionError, match="failed requests"):
        clients.assert_none_failed()


def test_a_run_that_sent_nothing_fails():
    clients = ApiClients(None)
    clients.results = {"1 client": [], "8 clients": [[1.0, 0.1, 200, ""]] * 3}
    with pytest.raises(AssertionError, match=r"fewer than 2 requests: \['1 client'\]"):
        clients.assert_none_failed()
    clients.results = {}
    with pytest.raises(AssertionError, match="fewer than 2 requests"):
        clients.assert_none_failed()


def test_a_request_in_flight_at_an_event_is_measured_with_it():
    """A request sent before the event and answered 30 s later (held through it) is the event's longest latency,
    though it did not begin within the event."""
    clients = ApiClients(None, groups=(("1 client", 1, 0.5),))
    clients.results = {"1 client": [[99.0, 31.0, 200, ""], [101.0, 0.2, 200, ""], [131.0, 0.1, 200, ""]]}
    clients.events = [("restart", 100.0)]
    rows = clients.figures(100.0, float("inf"))["1 client"]
    assert rows["requests"] == 3 and rows["max"] == 31.0
    assert clients.longest() == {"restart": 31.0}


def test_a_stream_is_in_flight_at_a_drain_only_while_it_runs():
    clients = ApiClients(None, groups=(ApiClients.GROUPS[0], ApiClients.STREAMS))
    clients.results = {"1 client": [[10.0, 0.1, 200, ""], [11.0, 0.1, 200, ""]],
                       ApiClients.STREAMS[0]: [[10.0, 5.0, 200, ""], [15.5, 5.0, 200, ""]]}
    clients.assert_streamed_through([(12.0, 13.0, 1, "drained in 1.0 s")])
    with pytest.raises(AssertionError):  # between two streams
        clients.assert_streamed_through([(15.2, 15.3, 1, "drained in 0.1 s")])
    with pytest.raises(AssertionError):  # the drain cut what ran
        clients.assert_streamed_through([(12.0, 72.0, 1, "1 request(s) still running after 60.0 s")])
    with pytest.raises(AssertionError):  # no drain at all
        clients.assert_streamed_through([])
    # The streams' latencies are not the events' longest: a stream is long by nature.
    clients.events = [("switch", 9.0)]
    assert clients.longest() == {"switch": 0.1}
