"""A stand-in for llama-server on its internal port, for the API front's tests: run where the front runs (in the
cluster's master by molecule/cluster/tests/test_front.py, on this machine by tests/unit/test_front_gate.py).

    python3 stand_in.py PORT [--loading SECONDS]

- GET /health: 200, or 503 while `down` or for 3 s after a failure (the restart systemd would make; long enough for
  the gate's probe to see it on a loaded machine).
- POST /completion: {"content": " Paris"} at once; after `slow` s for the prompt "slow"; for the prompt "fail",
  and for every POST that is not a completion, it fails as a crash does: the connection closed without an answer.
  No request of the pinned trees is known to crash llama-server: this stands in for one.
- --loading SECONDS: from the first completion on, every request (/health too) is answered 503 "Loading model" for
  that long, as a llama-server that has just restarted does in the instant after the old one's last 200.
- While `down`, every request is answered 503 "Loading model".
- GET /seen: the requests it got, by path. GET /ended: when it last finished answering a completion (this host's
  monotonic clock, s), or null. POST /control {"down": bool, "slow": seconds}: sets those.
Standard library only (the containers have python3 and nothing else)."""

import argparse
import collections
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


class State:
    def __init__(self, loading):
        self.loading, self.began = loading, None
        self.down, self.slow, self.failed_until = False, 2.0, 0.0
        self.seen, self.lock = collections.Counter(), threading.Lock()
        self.ended = None  # when the last completion's answer was written (time.monotonic())

    def unready(self, completion):
        """Whether to answer 503 "Loading model" now."""
        with self.lock:
            if completion and self.loading and self.began is None:
                self.began = time.monotonic()
            return self.down or (self.began is not None and time.monotonic() - self.began < self.loading)


def handler(state):
    class Handler(BaseHTTPRequestHandler):
        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path == "/seen":
                with state.lock:
                    return self.reply(200, dict(state.seen))
            if self.path == "/ended":
                return self.reply(200, state.ended)
            if state.unready(False) or time.monotonic() < state.failed_until:
                return self.reply(503, LOADING)
            return self.reply(200, {"status": "ok"})

        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            path = self.path.split("?")[0]
            if path == "/control":
                state.down, state.slow = body.get("down", state.down), body.get("slow", state.slow)
                return self.reply(200, {"down": state.down, "slow": state.slow})
            with state.lock:
                state.seen[path] += 1
            if state.unready(path == "/completion"):
                return self.reply(503, LOADING)
            if path != "/completion" or body.get("prompt") == "fail":
                state.failed_until = time.monotonic() + 3.0
                self.close_connection = True
                return None
            if body.get("prompt") == "slow":
                time.sleep(state.slow)
            self.reply(200, {"content": " Paris", "tokens_predicted": 1})
            self.wfile.flush()
            state.ended = time.monotonic()
            return None

        def log_message(self, *args):
            pass

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("port", type=int)
    parser.add_argument("--loading", type=float, default=0.0)
    args = parser.parse_args()
    ThreadingHTTPServer(("127.0.0.1", args.port), handler(State(args.loading))).serve_forever()


if __name__ == "__main__":
    main()
