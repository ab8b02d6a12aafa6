#!/usr/bin/python
"""Ansible module llama_health_wait: wait until a /health URL answers 200, and stop early when its unit crash-loops."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_health_wait
short_description: Wait until llama-server's /health answers 200, failing early when its unit keeps exiting
description:
  - Asks O(url) every O(delay) seconds until it answers 200 (llama-server answers 503 while the model loads).
  - With O(unit), it also reads the unit's restart count. When the unit has exited O(restarts) times since the
    wait began, or has failed for good, it fails at once with the errors of the unit's journal since then (a model
    llama-server cannot read, a flag the build refuses), instead of waiting out O(timeout) while systemd restarts it.
  - Fails after O(timeout) seconds otherwise, with the end of the unit's journal when O(unit) is given.
  - Reads only.
options:
  url:
    description: The /health URL, e.g. C(http://127.0.0.1:8080/health).
    type: str
    required: true
  timeout:
    description: Seconds to wait before failing.
    type: int
    required: true
  unit:
    description: The systemd unit of the process behind O(url); "" = do not watch it.
    type: str
    default: ""
  restarts:
    description: Exits of O(unit) since the wait began that end the wait (a crash loop).
    type: int
    default: 3
  delay:
    description: Seconds between two requests.
    type: float
    default: 2
  log:
    description:
      - A file the module writes its progress to every 10 s (the llama_job_wait action shows it, when the wait runs
        in the background) - how long it has waited, of how long a load is expected to take (O(expected)), and what
        the O(unit)'s process has read and written so far (the model's file, the weights sent to the workers).
      - An empty path writes none.
    type: path
    default: ""
  expected:
    description: Seconds the load is expected to take (role llama_prefill's estimate), for the progress lines. 0 is unknown.
    type: int
    default: 0
attributes:
  check_mode:
    description: Reads only; runs in check mode.
    support: full
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait until llama-server serves
  llamacpp.rpc_cluster.llama_health_wait:
    url: http://127.0.0.1:8080/health
    timeout: 600
    unit: llama-server.service
"""

RETURN = r"""
seconds:
  description: How long the wait took.
  type: float
  returned: success
restarts:
  description: The unit's exits during the wait (0 without O(unit)).
  type: int
  returned: always
"""

import re
import subprocess
import time
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

# What a journal line of llama.cpp or systemd says when a start fails.
ERROR = re.compile(r"(^|\s)E\s|error|fail|denied|invalid|unknown|not found", re.IGNORECASE)


def status(url):
    """The HTTP status of a GET of url, None when nothing answers."""
    try:
        with open_url(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, ValueError):
        return None


def unit_state(unit):
    """(restart count, active state, result) of a systemd unit."""
    out = subprocess.run(["systemctl", "show", unit, "-p", "NRestarts", "-p", "ActiveState", "-p", "Result"],
                         capture_output=True, text=True, check=False).stdout
    fields = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return int(fields.get("NRestarts") or 0), fields.get("ActiveState", ""), fields.get("Result", "")


def journal_errors(unit, since, lines=12):
    """The unit's journal lines since `since` (epoch seconds) that report an error, else its last lines."""
    out = subprocess.run(["journalctl", "-u", unit, "--since", f"@{int(since)}", "-o", "cat", "--no-pager"],
                         capture_output=True, text=True, check=False).stdout.splitlines()
    errors = [line for line in out if ERROR.search(line)]
    return (errors or out)[-lines:]


def process_io(unit):
    """(bytes read, bytes written) by the unit's main process so far (/proc/PID/io: files and sockets), or None."""
    out = subprocess.run(["systemctl", "show", unit, "-p", "MainPID", "--value"], capture_output=True, text=True,
                         check=False).stdout.strip()
    try:
        with open(f"/proc/{int(out)}/io", encoding="ascii") as handle:
            fields = dict(line.split(": ", 1) for line in handle.read().splitlines())
        return int(fields["rchar"]), int(fields["wchar"])
    except (ValueError, OSError, KeyError):
        return None


def progress_line(seconds, expected, answer, done):
    """`progress: loading ...`, for the llama_job_wait action."""
    of = f" of ~{expected} s expected" if expected else ""
    io = (f"; llama-server has read {done[0] / 2**30:.1f} GiB and sent {done[1] / 2**30:.1f} GiB"
          if done else "")
    return f"progress: {seconds:.0f} s{of}, /health {answer or 'not answering'}{io}"


def wait(url, timeout, unit, restarts, delay, log="", expected=0):
    """(ok, message, seconds, exits) once url answers 200, the unit crash-loops, or the time is out."""
    began, began_wall = time.monotonic(), time.time()
    first = unit_state(unit)[0] if unit else 0
    exits = 0
    shown = 0.0
    if log:
        open(log, "w", encoding="utf-8").close()
    while True:
        answer = status(url)
        seconds = time.monotonic() - began
        if log and seconds - shown >= 10:
            shown = seconds
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(progress_line(seconds, expected, answer, process_io(unit) if unit else None) + "\n")
        if answer == 200:
            return True, "", seconds, exits
        if unit:
            count, active, result = unit_state(unit)
            exits = count - first
            if exits >= restarts or active == "failed":
                what = (f"exited {exits} times in {seconds:.0f} s" if exits >= restarts
                        else f"failed ({result})")
                return False, (f"{unit} {what} since the wait for {url} began, and systemd keeps restarting it "
                               f"(no use waiting out {timeout} s). Its journal says:\n  "
                               + "\n  ".join(journal_errors(unit, began_wall))), seconds, exits
        if seconds >= timeout:
            tail = ("; the end of its journal:\n  " + "\n  ".join(journal_errors(unit, began_wall))) if unit else ""
            return False, (f"{url} did not answer 200 within {timeout} s (last answer: "
                           f"{answer or 'no connection'}){tail}"), seconds, exits
        time.sleep(delay)


def main():
    module = AnsibleModule(argument_spec={
        "url": {"type": "str", "required": True},
        "timeout": {"type": "int", "required": True},
        "unit": {"type": "str", "default": ""},
        "restarts": {"type": "int", "default": 3},
        "delay": {"type": "float", "default": 2},
        "log": {"type": "path", "default": ""},
        "expected": {"type": "int", "default": 0},
    }, supports_check_mode=True)
    params = module.params
    ok, message, seconds, exits = wait(params["url"], params["timeout"], params["unit"], max(params["restarts"], 1),
                                       params["delay"], params["log"], params["expected"])
    if not ok:
        module.fail_json(msg=message, restarts=exits)
    module.exit_json(changed=False, seconds=round(seconds, 1), restarts=exits)


if __name__ == "__main__":
    main()
