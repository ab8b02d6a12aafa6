#!/usr/bin/python3
"""Clients of the cluster's API, for the continuity tests: N clients, each sending a non-streaming completion, then
pausing INTERVAL s, until STOPFILE exists; then one JSON line on stdout: every request's start (monotonic s),
latency (s), HTTP status (0 = no answer) and error text.

Usage: api_clients.py URL CLIENTS INTERVAL STOPFILE [API_KEY]. Runs on the master (python3 of the distribution)."""

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

BODY = json.dumps({"prompt": "Hello", "n_predict": 4, "temperature": 0, "cache_prompt": False,
                   "ignore_eos": True}).encode()


def client(url, interval, stopfile, key, results):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    while not os.path.exists(stopfile):
        start = time.monotonic()
        status, error = 0, ""
        try:
            request = urllib.request.Request(url + "/completion", BODY, headers)
            with urllib.request.urlopen(request, timeout=600) as answer:
                reply = json.loads(answer.read())
                status = answer.status
                if not reply.get("tokens_predicted"):
                    error = "no tokens"
        except urllib.error.HTTPError as failure:
            status, error = failure.code, failure.read().decode(errors="replace")[:400]
        except Exception as failure:  # pylint: disable=broad-except  # any failure is a failed request
            error = f"{type(failure).__name__}: {failure}"[:200]
        results.append([round(start, 3), round(time.monotonic() - start, 3), status, error])
        time.sleep(interval)


def main():
    url, clients, interval, stopfile = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    key = sys.argv[5] if len(sys.argv) > 5 else ""
    results = []
    threads = [threading.Thread(target=client, args=(url, interval, stopfile, key, results)) for _ in range(clients)]
    for thread in threads:
        thread.start()
        time.sleep(interval / clients)  # spread over the interval
    for thread in threads:
        thread.join()
    print(json.dumps(sorted(results)))


if __name__ == "__main__":
    main()
