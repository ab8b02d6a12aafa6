"""Fixtures for the cluster scenario: the containers (docker backend, fast), the project's code, the plan."""

import json
import os
import sys
import time
from shlex import quote
from pathlib import Path

import pytest
import testinfra

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "cluster")
WORKERS = ("worker1", "worker2")
RPC_PORT = 50052
SERVER_PORT = 8080

sys.path[:0] = [str(PROJECT / "filter_plugins"), str(PROJECT / "module_utils")]


def container(name):
    return f"molecule-{SCENARIO}-{name}"


def connect(name):
    return testinfra.get_host(f"docker://{container(name)}")


@pytest.fixture(scope="session")
def master():
    return connect("master")


@pytest.fixture(scope="session")
def workers():
    return {name: connect(name) for name in WORKERS}


def address(host):
    """The container's address on the scenario network (what the roles use as the cluster address)."""
    return host.check_output("ip -4 -o route get 1.1.1.1 | sed -n 's/.* src \\([0-9.]*\\).*/\\1/p'")


def main_pid(host, unit):
    pid = host.check_output(f"systemctl show -p MainPID --value {unit}")
    assert pid not in ("", "0"), f"{unit} has no main process"
    return int(pid)


def cmdline(host, pid):
    return host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()


def option(args, name):
    return args[args.index(name) + 1]


HTTP = """
import json, sys, urllib.request, urllib.error
url, body, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
request = urllib.request.Request(url, data=body.encode() if body else None,
                                 headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
        print(response.status); print(response.read().decode())
except urllib.error.HTTPError as error:
    print(error.code); print(error.read().decode())
"""


def http(host, port, path, body=None, timeout=120):
    """(status, text) of a request made inside the container (the API is not published to the host).

    Uses the container's python3: the roles install no HTTP client, and the tests add nothing.
    """
    payload = json.dumps(body) if body is not None else ""
    result = host.run(f"python3 -c {quote(HTTP)} http://127.0.0.1:{port}{path} {quote(payload)} {timeout}")
    assert result.rc == 0, result.stderr
    status, _, text = result.stdout.partition("\n")
    return int(status), text


def http_json(host, port, path, body=None, timeout=120):
    status, text = http(host, port, path, body, timeout)
    assert status == 200, f"{path}: HTTP {status}: {text[:500]}"
    return json.loads(text)


def wait_health(host, port, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http(host, port, "/health", timeout=2)[0] == 200:
                return
        except AssertionError:
            pass
        time.sleep(1)
    raise AssertionError(f"llama-server on port {port} not healthy within {timeout}s")
