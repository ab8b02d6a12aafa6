#!/usr/bin/python3
"""Clients of the cluster's API, for the continuity tests: N clients, each sending a non-streaming completion, then
pausing INTERVAL s, until STOPFILE exists; then one JSON line on stdout: every request's start (monotonic s),
latency (s), HTTP status (0 = no answer) and error text.
With STREAM_TOKENS, each request is a stream of that many tokens (llama-server's SSE, ignore_eos), read to its end;
one that ends without llama-server's final event, or whose final event counts fewer tokens, is a failed request.
Events are not tokens: llama-server sends a token that ends inside a UTF-8 character with the next one.

Usage: api_clients.py URL CLIENTS INTERVAL STOPFILE [API_KEY [STREAM_TOKENS]]. Runs on the master (python3 of the
distribution)."""

import http.client
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

BODY = json.dumps({"prompt": "Hello", "n_predict": 4, "temperature": 0, "cache_prompt": False,
                   "ignore_eos": True}).encode()


def stream(url, headers, tokens):
    """One stream of `tokens` tokens read to its end: (HTTP status, error text: empty when it ended whole)."""
    address = url.split("://", 1)[1]
    connection = http.client.HTTPConnection(address, timeout=600)
    body = json.dumps({"prompt": "Once upon a time", "n_predict": tokens, "ignore_eos": True, "stream": True})
    connection.request("POST", "/completion", body, headers)
    answer = connection.getresponse()
    data = b""
    try:
        # read1, not readline: http.client's readline takes a chunked body cut short for its end.
        while chunk := answer.read1(65536):
            data += chunk
    except Exception as failure:  # pylint: disable=broad-except  # a cut stream is a failed request
        return answer.status, f"stream cut after {data.count(b'data:')} events: {type(failure).__name__}"
    finally:
        connection.close()
    events = [line[5:].strip() for line in data.split(b"\n") if line.startswith(b"data:")]
    if answer.status != 200:
        return answer.status, data.decode(errors="replace")[:400]
    try:
        final = json.loads(events[-1]) if events else {}
    except ValueError:
        final = {}
    if final.get("stop") is not True or final.get("tokens_predicted", 0) < tokens:
        return answer.status, f"stream ended after {len(events)} events without llama-server's final one"
    return answer.status, ""


def client(url, interval, stopfile, key, results, tokens=0):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    while not os.path.exists(stopfile):
        start = time.monotonic()
        status, error = 0, ""
        try:
            if tokens:
                status, error = stream(url, headers, tokens)
            else:
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
    tokens = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    results = []
    threads = [threading.Thread(target=client, args=(url, interval, stopfile, key, results, tokens))
               for _ in range(clients)]
    for thread in threads:
        thread.start()
        time.sleep(interval / clients)  # spread over the interval
    for thread in threads:
        thread.join()
    print(json.dumps(sorted(results)))


if __name__ == "__main__":
    main()
