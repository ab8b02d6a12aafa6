"""Helpers of the cluster scenarios' tests: the containers (docker backend), requests, ansible-playbook runs."""

import json
import os
import re
import subprocess
import time
from pathlib import Path
from shlex import quote

import testinfra

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[2]))
SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "cluster")
WORKERS = ("worker1", "worker2")
RPC_PORT = 50052
SERVER_PORT = 8080
# The scenarios' API key (molecule.yml llama_api_key). Sent with every request unless key=None; a server
# without a key ignores it.
API_KEY = "test-key-6f1d0c2a9b"


def container(name):
    return f"molecule-{SCENARIO}-{name}"


def connect(name):
    return testinfra.get_host(f"docker://{container(name)}")


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
url, body, timeout, key = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
headers = {"Content-Type": "application/json"}
if key:
    headers["Authorization"] = "Bearer " + key
request = urllib.request.Request(url, data=body.encode() if body else None, headers=headers)
try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
        print(response.status); print(response.read().decode())
except urllib.error.HTTPError as error:
    print(error.code); print(error.read().decode())
"""


def http(host, port, path, body=None, timeout=120, key=API_KEY):
    """(status, text) of a request made inside the container (the API is not published to the host).

    Uses the container's python3: the roles install no HTTP client, and the tests add nothing. The key
    travels in argv of a short-lived test process, never in the service's.
    """
    payload = json.dumps(body) if body is not None else ""
    result = host.run(f"python3 -c {quote(HTTP)} http://127.0.0.1:{port}{path} {quote(payload)} {timeout} "
                      f"{quote(key or '')}")
    assert result.rc == 0, result.stderr
    status, _, text = result.stdout.partition("\n")
    return int(status), text


def http_json(host, port, path, body=None, timeout=120, key=API_KEY):
    status, text = http(host, port, path, body, timeout, key)
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


def run_playbook(playbook, *args, inventory=None, timeout=900):
    """ansible-playbook with the project's config on the scenario's inventory; results as one-line JSON."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    command = ["ansible-playbook", playbook, "-i", str(inventory or os.environ["MOLECULE_INVENTORY_FILE"]), *args]
    return subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=timeout)


def recap(output):
    """{host: {ok, changed, failed, ...}} from the PLAY RECAP of an ansible-playbook run."""
    stats = {}
    for host, fields in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.M):
        stats[host] = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", fields)}
    return stats


def plays(output):
    """{play name: [task names]} of an ansible-playbook run, in order."""
    result, current = {}, None
    for line in output.splitlines():
        if line.startswith("PLAY [") and "RECAP" not in line:
            current = line[len("PLAY ["):line.rindex("]")]
            result.setdefault(current, [])
        elif line.startswith("TASK [") and current is not None:
            result[current].append(line[len("TASK ["):line.rindex("]")])
    return result
