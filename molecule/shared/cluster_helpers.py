"""Helpers of the cluster scenarios' tests: the containers (over SSH), requests, ansible-playbook runs."""

import contextlib
import functools
import json
import os
import re
import statistics
import subprocess
import time
import urllib.parse
from pathlib import Path
from shlex import quote

import pytest
from suite_report import children_cpu, figures, scenario_cpu
import testinfra.utils.ansible_runner

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
    """The host `name` as the scenario's inventory reaches it: over SSH, on a multiplexed connection."""
    return testinfra.utils.ansible_runner.AnsibleRunner.get_runner(os.environ["MOLECULE_INVENTORY_FILE"]).get_host(name)


@functools.cache
def inventory_addresses():
    """{host name: (the address the tests reach it at, its llama_cluster_address or None)}, from the scenario's
    inventory (the prefill scenario sets llama_cluster_address: its hosts' link, molecule/shared/link_bed.py)."""
    runner = testinfra.utils.ansible_runner.AnsibleRunner.get_runner(os.environ["MOLECULE_INVENTORY_FILE"])
    found = {}
    for name in runner.get_hosts("all"):
        variables = runner.get_variables(name)
        found[name] = (variables.get("ansible_host", name), variables.get("llama_cluster_address"))
    return found


def address(host):
    """The host's cluster address (what the roles use): its llama_cluster_address where the inventory sets one, else
    its address on the scenario network."""
    reached = host.backend.get_hostname()
    for reach, cluster in inventory_addresses().values():
        if reach == reached and cluster:
            return cluster
    return host.check_output("ip -4 -o route get 1.1.1.1 | sed -n 's/.* src \\([0-9.]*\\).*/\\1/p'")


def tcp_connects(host, ip, port, seconds=3):
    """A bare TCP connect from `host` (no byte sent): True when the handshake completes."""
    return host.run(f"timeout {seconds} bash -c 'exec 3<>/dev/tcp/{ip}/{port}'").rc == 0


def main_pid(host, unit):
    pid = host.check_output(f"systemctl show -p MainPID --value {unit}")
    assert pid not in ("", "0"), f"{unit} has no main process"
    return int(pid)


def rpc_server_pid(host):
    """The RPC server process of llama-rpc-server.service: the child of its session guard (llama-rpc-session, the
    unit's main process, llama_rpc_fresh_per_session), else the main process itself."""
    main = main_pid(host, "llama-rpc-server.service")
    children = host.run(f"pgrep -P {main}").stdout.split()
    return int(children[0]) if children else main


def service_pids(master, workers):
    """{"master": llama-server's main PID, worker name: its RPC server's main PID}."""
    return {"master": main_pid(master, "llama-server.service"),
            **{name: main_pid(host, "llama-rpc-server.service") for name, host in workers.items()}}


def listeners(host, port):
    """{local address:port: the unit whose cgroup holds the socket} of the sockets listening on `port`."""
    found = {}
    for line in host.check_output(f"ss -Hltne sport = :{port}").splitlines():
        unit = re.search(r"cgroup:\S*/([^/\s]+\.service)", line)
        found[line.split()[3]] = unit.group(1) if unit else None
    return found


def cmdline(host, pid):
    return host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()


def option(args, name, default=None):
    """The value after `name` in args; `default` when it is absent (None: absent is an error)."""
    if default is not None and name not in args:
        return default
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


def prometheus_query(host, expr, port=9090):
    """{instance: value} of an instant query, asked of the Prometheus on `host` (role llama_monitor)."""
    data = http_json(host, port, "/api/v1/query?query=" + urllib.parse.quote(expr), key=None)
    return {sample["metric"].get("instance", ""): float(sample["value"][1]) for sample in data["data"]["result"]}


def wait_restarted(host, pid, unit="llama-server.service", timeout=60):
    """Until `unit` on `host` runs as another process than `pid` (a restart by the watch, systemd or a play)."""
    deadline = time.monotonic() + timeout
    while host.check_output(f"systemctl show -p MainPID --value {unit}") in ("0", str(pid)):
        assert time.monotonic() < deadline, (
            f"{unit} was not restarted within {timeout} s:\n"
            + host.run(f"journalctl -n 30 --no-pager -u llama-server-watch -u {unit}; ss -tan").stdout)
        time.sleep(0.2)


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


def run_playbook(playbook, *args, inventory=None, timeout=900, env=None):
    """ansible-playbook with the project's config on the scenario's inventory; results as one-line JSON. `env`: more
    environment variables for this run (Ansible settings)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_CALLBACK_RESULT_FORMAT="json", **(env or {}))
    command = ["ansible-playbook", playbook, "-i", str(inventory or os.environ["MOLECULE_INVENTORY_FILE"]), *args]
    # Each run's cost, for a closer look at where the suite's time goes (make test: .cache/playbook-runs.txt): its
    # wall time, this machine's CPU (ansible-playbook and everything it ran, all waited for) and the containers'.
    report_file = os.environ.get("LLAMA_RUN_REPORT")
    started, host, inside = (time.monotonic(), children_cpu(), scenario_cpu()) if report_file else (0, 0, 0)
    result = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=timeout)
    if report_file:
        with open(report_file, "a", encoding="utf-8") as report:
            report.write(f"{SCENARIO} {time.monotonic() - started:.1f} {children_cpu() - host:.1f} "
                         f"{scenario_cpu() - inside:.1f} {result.returncode} {playbook} {' '.join(args)[:200]}\n")
    return result


# A row of the link check's table (role llama_link), as the JSON result format prints the debug message's lines.
LINK_ROW = re.compile(r'^\s*"(?P<worker>\S+)\s+(?P<address>\d[\d.]+)\s+(?P<rtt>[\d.]+|-)\s+(?P<gbits>[\d.]+|-)\s+'
                      r'(?P<verdict>[^"]*)",?$', re.M)


def link_rows(output):
    """{worker: {worker, address, rtt, gbits, verdict}} of the link check's table in a play's output."""
    return {match["worker"]: match.groupdict() for match in LINK_ROW.finditer(output)}


def recap(output):
    """{host: {ok, changed, failed, ...}} from the PLAY RECAP of an ansible-playbook run."""
    stats = {}
    for host, fields in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.M):
        stats[host] = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", fields)}
    return stats


def plays(output):
    """{play name: [task names]} of an ansible-playbook run, in order; a role's task by its role's short name
    ("llama_link : ..."; Ansible shows the roles by the collection's FQCN)."""
    result, current = {}, None
    for line in output.splitlines():
        if line.startswith("PLAY [") and "RECAP" not in line:
            current = line[len("PLAY ["):line.rindex("]")]
            result.setdefault(current, [])
        elif line.startswith("TASK [") and current is not None:
            result[current].append(line[len("TASK ["):line.rindex("]")].removeprefix("llamacpp.rpc_cluster."))
    return result


# What playbooks/decommission.yml removes from a host: the project's units and paths (the metrics exporter's too).
DECOMMISSIONED_UNITS = ["llama-front.service", "llama-server-watch.service", "llama-server.service",
                        "llama-rpc-tls-clients.service", "llama-rpc-server.service", "llama-rpc-tls.service",
                        "llama-firewall.service", "llama-cluster-exporter.service", "llama-cluster-exporter.timer"]
DECOMMISSIONED_PATHS = ["/etc/llama-front", "/etc/llama.cpp", "/opt/llama.cpp", "/var/cache/llama.cpp",
                        "/var/cache/llama-vulkan-shaders", "/var/lib/llama.cpp",
                        "/usr/local/sbin/llama-wait-workers", "/usr/local/sbin/llama-server-watch",
                        "/usr/local/sbin/llama-rpc-session", "/usr/local/sbin/llama-switch",
                        "/usr/local/sbin/llama-prefill-source"]


def assert_decommissioned(host):
    """Nothing of the project's is left on `host`: units, their files, paths, the service user and group."""
    for unit in DECOMMISSIONED_UNITS:
        assert host.run(f"systemctl show -p LoadState --value {unit}").stdout.strip() == "not-found", unit
        assert not host.file(f"/etc/systemd/system/{unit}").exists, unit
    for path in DECOMMISSIONED_PATHS:
        assert not host.file(path).exists, path
    assert host.run("getent passwd llama").rc == 2
    assert host.run("getent group llama").rc == 2


def failure_messages(output):
    """The `msg` of every failed task result (JSON results: one object per line after `FAILED! => `), each entry of
    a list `msg` (preflight's list of a host's problems) on its own."""
    messages = [json.loads(match)["msg"] for match in re.findall(r"FAILED! => (\{.*\})$", output, re.M)]
    return [text for message in messages for text in (message if isinstance(message, list) else [message])]


def assert_refused_in_preflight(result, message):
    """The run failed with `message` (a regex matched from the start of a failed task's msg) in the checks:
    no later play started, no host changed."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    messages = failure_messages(output)
    assert any(re.match(message, text) for text in messages), (messages, output[-3000:])
    assert "PLAY [Variables]" in output
    for later in ("Synchronise the cluster's clocks", "Build llama.cpp", "Stage the master's models",
                  "Admit the cluster's ports", "Run the RPC server", "Run llama-server"):
        assert f"PLAY [{later}" not in output, output[-3000:]
    assert not re.search(r"changed=[1-9]", output)


def assert_check_changes_nothing(hosts=("master", "worker1", "worker2")):
    """`site.yml --check --diff` on the converged cluster passes and reports no change on any host."""
    result = run_playbook("site.yml", "--check", "--diff")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    stats = recap(output)
    assert set(hosts) <= set(stats)
    assert all(counts["changed"] == 0 and counts["failed"] == 0 for counts in stats.values()), output[-4000:]


def text(result):
    """A command's output as text. llama-server logs the pieces of tokens it generates, which may end inside a UTF-8
    character: decoded strictly, as testinfra's `stdout` does, such a journal raises UnicodeDecodeError."""
    return result.stdout_bytes.decode("utf-8", "replace")


def journal(host, unit, since):
    """`unit`'s journal on `host` since `since` (journalctl's --since), as text whatever bytes it holds."""
    return text(host.run_expect([0], f"journalctl --no-pager -o cat -u {unit} --since '{since}'"))


def journal_tail(host, units, lines=40):
    """The last `lines` of `units`' journal on `host`, without llama.cpp's debug lines (--verbose): for a failure's
    message, so that the log says why a service stopped serving."""
    selected = " ".join(f"-u {unit}" for unit in units)
    debug = "'^[^:]+:[^:]+:[^:]+: [0-9.]+ D '"
    return text(host.run(f"journalctl --no-pager -o short-precise {selected} | grep -v -E {debug} | tail -n {lines}"))


def drains(host, since, wait=30):
    """The front's drains (llama-front-drain: llama-server's ExecStop, upgrade.yml's) in the journal of `host` since
    `since` (its monotonic clock, s): [(start, end, requests running once the gate held, how it ended)]; the start is
    when the drain began, before its gate held. Every caller expects one: read again for up to `wait` s while none is
    there (journald reads a unit's output when it gets the CPU, seconds later on a loaded host)."""
    deadline = time.monotonic() + wait
    found = _drains(host, since)
    while not found and time.monotonic() < deadline:
        time.sleep(2)
        found = _drains(host, since)
    return found


def drain_log(host, since):
    """What llama-front-drain logged (as upgrade.yml's or a restart's drain, to syslog) on `host` since `since` (its
    monotonic clock, s): [(when, message)]."""
    logged = []
    for line in host.check_output("journalctl -t llama-front-drain -o json --no-pager --since -60min").splitlines():
        entry = json.loads(line)
        at, message = int(entry["__MONOTONIC_TIMESTAMP"]) / 1e6, entry.get("MESSAGE")
        if at >= since and isinstance(message, str):
            logged.append((at, message))
    return logged


def _drains(host, since):
    found, start = [], None
    for at, message in drain_log(host, since):
        held = re.search(r"holding new requests; (\d+) running(?: \(the gate held after ([\d.]+) s\))?", message)
        if held:
            start = (at - float(held.group(2) or 0), int(held.group(1)))
        elif start:
            found.append((start[0], at, start[1], message.removeprefix("llama-front-drain: ")))
            start = None
    return found


def service_state(host, unit):
    """How `unit` last ended and how often systemd restarted it, on one line: a failure message's first line."""
    return " ".join(host.run(f"systemctl show -p NRestarts -p ExecMainCode -p ExecMainStatus -p ActiveEnterTimestamp "
                             f"{unit}").stdout.split())


# What glibc, the kernel and the session guard print when an RPC server dies: heap corruption found by malloc
# ("corrupted double-linked list", "double free or corruption", "malloc(): unsorted double linked list corrupted"), a
# signal, the guard's record of it.
CRASH_MARKERS = r"corrupted|double free|free\(\): invalid|malloc\(\)|SIGABRT|SIGSEGV|core-dump|ended by itself"


def rpc_server_crashes(workers, since="-1d"):
    """{worker: what shows its RPC server crashed since `since`}: systemd's restart count, the crash lines of its
    journal (empty when none crashed)."""
    found = {}
    for name, host in workers.items():
        restarts = host.check_output("systemctl show -p NRestarts --value llama-rpc-server.service")
        lines = host.run(f"journalctl -o cat -u llama-rpc-server.service --since '{since}' | grep -E '{CRASH_MARKERS}'"
                         ).stdout.strip()
        if restarts != "0" or lines:
            found[name] = f"NRestarts={restarts}; {service_state(host, 'llama-rpc-server.service')}; {lines[-600:]}"
    return found


def order_tests(items, order):
    """Sort collected tests by their file's place in `order`; a test file `order` does not name is an error (its
    place is decided, not left to the alphabet)."""
    unplaced = sorted({item.path.name for item in items} - set(order))
    if unplaced:
        raise pytest.UsageError(f"test files without a place in the scenario's ORDER (tests/conftest.py): {unplaced}")
    items.sort(key=lambda item: order.index(item.path.name))


class Chain:
    """Tests that each start from the state the one before left (a conftest wires `setup` and `report` to pytest's
    runtest_setup and runtest_makereport hooks): after the first failure the others are skipped, naming it, instead
    of failing on a state nobody meant."""

    def __init__(self):
        self.broken = None

    def setup(self, item):
        if self.broken:
            pytest.skip(f"the chain broke at {self.broken}: this test starts from the state that test leaves")

    def report(self, item, call):
        if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception) and not self.broken:
            self.broken = item.nodeid


def placement(master):
    """(planned, actual, log) of the running llama-server: {layer: device} from its unit's "# Plan:" line and
    from llama.cpp's load log ("layer N assigned to device X", logged with --verbose), and that log."""
    unit = master.file("/etc/systemd/system/llama-server.service").content_string
    planned = {}
    for device, first, end in re.findall(r"(\w+)=(\d+)-(\d+)", re.search(r"^# Plan: (.*)$", unit, re.M).group(1)):
        planned.update({layer: device for layer in range(int(first), int(end))})
    invocation = master.check_output("systemctl show -p InvocationID --value llama-server.service")
    log = master.check_output(f"journalctl -o cat _SYSTEMD_INVOCATION_ID={invocation}")
    actual = {int(layer): device for layer, device in re.findall(r"layer +(\d+) assigned to device (\w+)", log)}
    return planned, actual, log


def stop_server_on(host, port):
    """End a llama-server a test started on `port` and wait (up to 60 s) until it is gone. The pattern's [] keeps it
    from matching the shell that runs pkill."""
    digits = str(port)
    pattern = f"--port [{digits[0]}]{digits[1:]}"
    host.run(f"pkill -f -- '{pattern}'; for i in $(seq 300); do pgrep -f -- '{pattern}' >/dev/null || break; "
             "sleep 0.2; done")


def single_process_completion(master, model, body, port=18181):
    """`body` answered by a llama-server of one process (no RPC) on the master, started for the request on
    `port` with the cluster's model, as the service user, read without mmap (--load-mode none from 0c1e570 on,
    --no-mmap before)."""
    binary = "/opt/llama.cpp/current/bin/llama-server"
    started = master.run(
        f"if {binary} --help 2>&1 | grep -q -- --load-mode; then read='--load-mode none'; else read=--no-mmap; fi; "
        f"runuser -u llama -- timeout 300 {binary} -m {model} -c 2048 -t 1 "
        f"--host 127.0.0.1 --port {port} $read > /tmp/single.log 2>&1 & echo $!")
    assert started.rc == 0
    try:
        wait_health(master, port)
        return http_json(master, port, "/completion", body)
    finally:
        stop_server_on(master, port)


_DECODE = {"prompt": "Once upon a time", "n_predict": 64, "temperature": 0, "seed": 1234, "cache_prompt": False,
          "ignore_eos": True}

# Restart llama-server and time it until /health answers 200 (all in the container: no docker exec per poll).
_LOAD = r"""
import subprocess, sys, time, urllib.request, urllib.error
# Restarts in quick succession would hit systemd's start rate limit (5 in 10 s): reset its counter first.
subprocess.run(["systemctl", "reset-failed", "llama-server.service"], check=True)
start = time.monotonic()
subprocess.run(["systemctl", "restart", "llama-server.service"], check=True)
while True:
    if time.monotonic() - start > 300:
        sys.exit("llama-server did not answer /health with 200 within 300 s of its restart")
    try:
        with urllib.request.urlopen("http://127.0.0.1:%s/health", timeout=2) as response:
            if response.status == 200:
                break
    except (urllib.error.URLError, OSError):
        pass
    time.sleep(0.05)
print(round(time.monotonic() - start, 3))
"""


def measure_serving(master, runs=5, port=SERVER_PORT):
    """Median model load (restart of llama-server to /health 200) and decode speed (64 tokens, greedy) over
    `runs` tries, with every value."""
    loads, speeds = [], []
    for _ in range(runs):
        loads.append(float(master.check_output(f"python3 -c {quote(_LOAD % port)}")))
        wait_health(master, port)
        http_json(master, port, "/completion", dict(_DECODE, n_predict=4))  # warm-up
    for _ in range(runs):
        answer = http_json(master, port, "/completion", _DECODE)
        assert answer["tokens_predicted"] == 64
        speeds.append(answer["timings"]["predicted_per_second"])
    return {"load_s": statistics.median(loads), "loads_s": loads,
            "decode_tps": statistics.median(speeds), "decodes_tps": speeds}


# Fixtures of the cluster scenarios (a conftest imports them): the containers, through testinfra.
@pytest.fixture(scope="session")
def master():
    return connect("master")


@pytest.fixture(scope="session")
def workers():
    return {name: connect(name) for name in WORKERS}


class ApiClients:
    """Clients of the API on `host` (molecule/shared/api_clients.py, run there) while a `with` block runs: each
    group (name, number of clients, interval[, tokens]) sends non-streaming completions, or streams of `tokens`
    tokens (failed unless whole), each client pausing `interval` s between them. `events` records what the test did when (the host's monotonic clock); `results` holds, after the
    block, every request of each group: [start, latency s, HTTP status (0: none), error].

    The default groups: one client asking every 0.5 s, and 8 concurrent clients each asking every 2 s. The 8 are
    all held at once through every outage of a second or more, which is what they test; asking every 0.5 s too
    (18 requests a second in all) they kept the cluster's cores busy for the whole test."""

    SCRIPT = Path(__file__).with_name("api_clients.py")
    GROUPS = (("1 client", 1, 0.5), ("8 clients", 8, 2.0))
    # One client streaming 400 tokens back to back: a stream is in flight at almost every moment.
    STREAMS = ("400-token streams", 1, 0.0, 400)

    def __init__(self, host, groups=GROUPS, port=SERVER_PORT, key=API_KEY):
        self.host, self.groups, self.port, self.key = host, groups, port, key
        self.events, self.results = [], {}

    def __enter__(self):
        self.host.run(f"cat > /tmp/api_clients.py <<'EOF'\n{self.SCRIPT.read_text()}\nEOF\nrm -f /tmp/api-clients.stop")
        for index, (_, count, interval, *tokens) in enumerate(self.groups):
            self.host.run(f"nohup python3 /tmp/api_clients.py http://127.0.0.1:{self.port} {count} {interval} "
                          f"/tmp/api-clients.stop {quote(self.key or '')} {tokens[0] if tokens else 0} "
                          f"> /tmp/api-clients-{index}.json 2> /tmp/api-clients-{index}.err &")
        time.sleep(3)  # every client has asked once
        return self

    def event(self, name):
        """Record that `name` happens now (before the test makes it happen)."""
        self.events.append((name, monotonic(self.host)))

    def __exit__(self, *failure):
        self.host.run("touch /tmp/api-clients.stop")
        deadline = time.monotonic() + 700
        for index, (name, *_) in enumerate(self.groups):
            while True:
                text = self.host.run(f"cat /tmp/api-clients-{index}.json").stdout
                if text.endswith("\n"):
                    self.results[name] = json.loads(text)
                    break
                assert time.monotonic() < deadline, self.host.run(f"cat /tmp/api-clients-{index}.err").stdout
                time.sleep(0.5)
        return False

    @property
    def streams(self):
        """The names of the groups that stream."""
        return [name for name, *rest in self.groups if len(rest) > 2 and rest[2]]

    def in_flight(self, group, at):
        """The requests of `group` that had started and not yet ended at `at` (the host's monotonic clock)."""
        return [r for r in self.results[group] if r[0] < at < r[0] + r[1]]

    def failed(self):
        """{group: the requests not answered 200 with tokens}."""
        return {name: [r for r in requests if r[2] != 200 or r[3]] for name, requests in self.results.items()}

    def assert_none_failed(self):
        """Every request of every group was answered (the failed ones, if any, in the message)."""
        failed = {name: requests for name, requests in self.failed().items() if requests}
        # This module is not a test module: pytest does not rewrite its asserts, so the message says it all.
        if failed and self.host is not None:  # what the master did meanwhile, for the failure's message
            log = journal_tail(self.host, ["llama-server", "llama-server-watch", "llama-front"], lines=60)
            failed["the master's journal"] = log.splitlines()
        assert not failed, f"failed requests ([start, latency s, HTTP status, error]): {failed}; events: {self.events}"
        # And there were requests: a client that never asked fails nothing.
        empty = [name for name, requests in self.results.items() if len(requests) < 2]
        assert self.results and not empty, f"groups that sent fewer than 2 requests: {empty or list(self.groups)}"

    def figures(self, since, until):
        """Per group, the requests started in [since, until) and those in flight at `since` (an event cuts or holds
        them first): count, failed, latency p50/p99/max (s), and the outage: from `since` to the first answer of a
        request sent after it."""
        rows = {}
        for name, requests in self.results.items():
            window = [r for r in requests if since <= r[0] < until] + self.in_flight(name, since)
            latencies = sorted(r[1] for r in window) or [0.0]
            answered = [r[0] + r[1] - since for r in window if r[2] == 200 and not r[3] and r[0] >= since]
            rows[name] = {"requests": len(window), "failed": sum(1 for r in window if r[2] != 200 or r[3]),
                          "p50": latencies[len(latencies) // 2],
                          "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
                          "max": latencies[-1], "outage": min(answered) if answered else None}
        return rows

    def windows(self):
        """(event, its figures: from its time until the next event's) for each event in order."""
        bounds = [at for _, at in self.events] + [float("inf")]
        return [(event, self.figures(at, until)) for (event, at), until in zip(self.events, bounds[1:])]

    def longest(self):
        """{event: the longest latency of a request started during it or in flight at it, over every group but the
        streams} (s)."""
        return {event: max(row["max"] for group, row in rows.items() if group not in self.streams)
                for event, rows in self.windows()}

    def assert_streamed_through(self, drained):
        """A stream was in flight when the first drain in `drained` (drains()) began, and every drain waited for what
        ran (the streams, whole, are checked by assert_none_failed). A later drain (llama-server's own stop after a
        model switch's or upgrade.yml's) finds the front holding already."""
        streams = self.streams
        assert streams and drained, (streams, drained)
        for _, _, _, outcome in drained:
            assert outcome.startswith("drained in"), drained
        start = drained[0][0]
        assert any(self.in_flight(name, start) for name in streams), (start, self.results[streams[0]])

    def report(self, title):
        """One line per event and group: the test's figures (suite_report.figures: the suite's summary shows
        them), returned."""
        lines = []
        for event, rows in self.windows():
            for group, row in rows.items():
                outage = "-" if row["outage"] is None else f"{row['outage']:.1f} s"
                lines.append(f"  {event:40} {group:9} {row['requests']:4} requests {row['failed']:2} failed; latency "
                             f"p50 {row['p50']:.2f} s p99 {row['p99']:.2f} s max {row['max']:.2f} s; "
                             f"first answer after {outage}")
        return figures(title, lines)


def replica_rates(host, target, seconds, clients=8, port=SERVER_PORT, key=API_KEY):
    """`clients` clients asking back to back through the front on `host`: `seconds` with every replica of their model,
    then `seconds` with the replica `target` (BACKEND/SERVER) drained (llama-front-drain --server), which is then put
    back in service. (the ApiClients, [requests/s begun in the first window, in the second from its second second on:
    the drain's own wait])."""
    drain = f"/usr/local/sbin/llama-front-drain --server {quote(target)}"
    group = f"{clients} clients"
    with ApiClients(host, groups=((group, clients, 0.0),), port=port, key=key) as asking:
        asking.event("every replica")
        time.sleep(seconds)
        host.check_output(f"{drain} 60")
        asking.event(f"{target} drained")
        time.sleep(seconds)
        asking.event("end")
    host.check_output(f"{drain} --end")
    (_, every), (_, drained), (_, end) = asking.events
    return asking, [len([r for r in asking.results[group] if since <= r[0] < until]) / (until - since)
                    for since, until in ((every, drained), (drained + 1, end))]


STAND_IN = Path(__file__).with_name("stand_in.py")


@contextlib.contextmanager
def stand_in(host, port, *args):
    """llama-server stopped and molecule/shared/stand_in.py (ARGS) on its port while the block runs; then
    llama-server started again."""
    host.check_output("systemctl stop llama-server.service")
    host.check_output(f"cat > /tmp/stand_in.py <<'EOF'\n{STAND_IN.read_text()}\nEOF")
    pid = host.check_output(f"nohup python3 /tmp/stand_in.py {port} {' '.join(map(quote, args))} >/dev/null 2>&1 "
                            "& echo $!")
    try:
        yield
    finally:
        host.run(f"kill {pid}")
        host.check_output("systemctl start llama-server.service")


def monotonic(host):
    """The host's monotonic clock (s): what api_clients.py stamps its requests with."""
    return float(host.check_output("python3 -c 'import time; print(time.monotonic())'"))
