"""Roles llama_metrics and llama_monitor on the running cluster, with a real Prometheus on the master (group
llama_monitor): every node's node-exporter is up and serves the llama_cluster_* metrics; every worker is connected;
a stopped worker raises LlamaWorkerDown, which resolves once the cluster has healed; faults that remove their own
series (an exporter stopped, the front stopped) raise LlamaTargetDown, LlamaMetricsMissing, LlamaFrontDown and
LlamaApiUnhealthy; llama-server stopped with a request held raises LlamaMasterDown, LlamaApiUnhealthy and
LlamaFrontHolding; a stranger reaches no exporter while the monitor does; the exporter costs little CPU.
The other rules (LlamaWorkerNotConnected, LlamaFewerDevicesThanPlanned, LlamaBuildDrift, LlamaClockOffset,
LlamaRpcCacheNearCap, LlamaExporterStale) are tested in promtool only (tests/unit/test_alert_rules.py): their faults
cannot be made here (a current llama-server does not start without a worker, a container cannot step the clock) or
their for: is minutes."""

import time
import urllib.parse
from shlex import quote

import pytest
from cluster_helpers import (API_KEY, SERVER_PORT, WORKERS, address, connect, http_json, prometheus_query,
                             tcp_connects, wait_health)
from suite_report import figures

NODES = ("master", *WORKERS)
METRICS_PORT = 9100
PROMETHEUS_PORT = 9090
# molecule.yml: the exporter's interval, the scrape (and rule evaluation) interval, the alerts' for:, LlamaFrontHolding's.
EXPORTER_INTERVAL, SCRAPE_INTERVAL, ALERT_AFTER, HOLD_ALERT_AFTER = 10, 5, 10, 15
# The waits' bounds are what the settings allow, times LOADED: on a host whose cores the suite's other lanes keep
# busy, the exporter's timer, the scrapes and the rule evaluations run late (LlamaMetricsMissing was seen 0.7 s
# past its 40 s). The figures report the seconds each alert took.
LOADED = 3


def query(master, expr):
    """{instance: value} of an instant query, asked of the Prometheus on the master."""
    return prometheus_query(master, expr, PROMETHEUS_PORT)


def alerts(master, name):
    """The pending and firing alerts `name`, as Prometheus lists them."""
    data = http_json(master, PROMETHEUS_PORT, "/api/v1/alerts", key=None)
    return [alert for alert in data["data"]["alerts"] if alert["labels"]["alertname"] == name]


def wait_for(what, check, timeout):
    """check()'s first true value, asked every half second; fails naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.5)
    return value


@pytest.fixture(scope="module")
def stranger():
    """A container on the cluster's network that is not in the inventory."""
    return connect("stranger")


def test_every_node_is_scraped_and_every_worker_connected(master):
    wait_for("every node's node-exporter up", lambda: query(master, 'up{job="llama-node"}') == dict.fromkeys(NODES, 1),
             3 * SCRAPE_INTERVAL)
    # node-exporter's own metrics and the cluster's, from its textfile collector, of every node.
    assert set(query(master, "node_load1")) == set(NODES)
    assert set(query(master, "llama_cluster_exporter_timestamp_seconds")) == set(NODES)
    assert query(master, 'node_textfile_scrape_error') == dict.fromkeys(NODES, 0)
    # An earlier test may just have restarted a worker: its metrics follow within an exporter run and a scrape.
    wait_for("every worker up and connected, every endpoint held", lambda: query(master, "llama_cluster_worker_up")
             == query(master, "llama_cluster_worker_connected") == dict.fromkeys(WORKERS, 1)
             and query(master, "llama_cluster_rpc_endpoints_connected") == {"master": len(WORKERS)},
             EXPORTER_INTERVAL + 2 * SCRAPE_INTERVAL + 5)
    assert query(master, "llama_cluster_server_up") == {"master": 1}
    # How long the running llama-server took to load its model, from its journal: on the master only.
    load = wait_for("the master's model load seconds", lambda: query(master, "llama_cluster_model_load_seconds"),
                    EXPORTER_INTERVAL + 2 * SCRAPE_INTERVAL)
    assert set(load) == {"master"} and 0 < load["master"] < 180, load
    figures("llama_cluster_model_load_seconds", [f"master: {load['master']:.2f} s"])
    assert query(master, "llama_cluster_rpc_endpoints_planned") == {"master": len(WORKERS)}
    builds = query(master, "count by (instance, commit, protocol) (llama_cluster_build_info)")
    assert set(builds) == set(NODES) and len(query(master, "count by (commit) (llama_cluster_build_info)")) == 1
    # The plan's devices: every layer of the model on a worker (the master here has none of its own).
    by_host = http_json(master, PROMETHEUS_PORT, "/api/v1/query?query=" + urllib.parse.quote(
        "sum by (host) (llama_cluster_device_planned_layers)"), key=None)["data"]["result"]
    assert {sample["metric"]["host"] for sample in by_host} == set(WORKERS), by_host
    # And what llama.cpp loaded there: the same layers (its --verbose load log), weights on each device.
    assert query(master, "sum(llama_cluster_device_loaded_layers) - sum(llama_cluster_device_planned_layers)") == \
        {"": 0}
    assert query(master, "count(llama_cluster_device_loaded_bytes > 0)") == {"": len(WORKERS)}
    # llama-server's own metrics (through the API, with the key) and the front's (HAProxy's exporter).
    for job in ("llama-server", "llama-front"):
        assert query(master, f'up{{job="{job}"}}') == {"master": 1}, job
    assert query(master, "llamacpp:prompt_tokens_total") and query(master, "llamacpp:requests_processing")
    assert query(master, 'haproxy_frontend_current_sessions{proxy="api"}')
    # A healthy cluster raises nothing: an alert left pending by a worker an earlier test restarted goes at the
    # rules' next evaluation after the metrics above healed (the evaluation interval is the scrape interval).
    raised = lambda: http_json(master, PROMETHEUS_PORT, "/api/v1/alerts", key=None)["data"]["alerts"]  # noqa: E731
    wait_for("no alert", lambda: raised() == [], 2 * SCRAPE_INTERVAL + 1)


def test_a_stranger_reaches_no_exporter_and_the_monitor_does(master, workers, stranger):
    for name, host in {"master": master, **workers}.items():
        assert not tcp_connects(stranger, address(host), METRICS_PORT), f"{name}: a stranger reached node-exporter"
        assert tcp_connects(master, address(host), METRICS_PORT), f"{name}: the monitor cannot reach node-exporter"


FETCH = """
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as error:
    print(error.code)
"""


def test_the_front_s_metrics_are_the_monitor_s_only(master, stranger):
    """HAProxy's exporter answers on the API's port, to the llama_monitor hosts only (its source address)."""
    url = f"http://{address(master)}:{SERVER_PORT}/llama-front/metrics"
    assert stranger.check_output(f"python3 -c {quote(FETCH)} {url}") == "403"
    assert master.check_output(f"python3 -c {quote(FETCH)} {url}") == "200"


def test_a_stopped_worker_raises_its_alert_until_the_cluster_heals(master, workers):
    worker = workers["worker2"]
    started = time.monotonic()
    worker.check_output("systemctl stop llama-rpc-server.service")
    try:
        # The exporter sees it within its interval, Prometheus within a scrape, the rule fires after its for: (the
        # rule's evaluation interval is the scrape interval).
        budget = LOADED * (EXPORTER_INTERVAL + ALERT_AFTER + 2 * SCRAPE_INTERVAL + SCRAPE_INTERVAL)
        firing = wait_for("LlamaWorkerDown firing for worker2", lambda: [
            alert for alert in alerts(master, "LlamaWorkerDown") if alert["state"] == "firing"], budget)
        fired = time.monotonic() - started
        assert [alert["labels"]["instance"] for alert in firing] == ["worker2"], firing
        assert "llama-rpc-server.service on worker2 is not active" in firing[0]["annotations"]["description"]
    finally:
        worker.check_output("systemctl start llama-rpc-server.service")
    back = time.monotonic()
    # The master's watch restarts llama-server onto the worker; the alert goes once the exporter and a scrape saw it.
    wait_health(master, SERVER_PORT, timeout=180)
    wait_for("LlamaWorkerDown resolved", lambda: not alerts(master, "LlamaWorkerDown"),
             EXPORTER_INTERVAL + 3 * SCRAPE_INTERVAL)
    wait_for("worker2 connected again", lambda: query(master, 'llama_cluster_worker_connected{instance="worker2"}')
             == {"worker2": 1}, 60)
    figures("LlamaWorkerDown (exporter 10 s, scrape 5 s, for: 10 s)",
            [f"fired {fired:.1f} s after the stop (budget {budget} s)",
             f"resolved and connected {time.monotonic() - back:.1f} s after the start"])


# The label that tells apart two alerts of one rule on one host.
TELLS = {"LlamaTargetDown": "job", "LlamaMetricsMissing": "series", "LlamaFrontDown": "unit", "LlamaApiUnhealthy": "path"}


def firing(master, name):
    """{(instance, TELLS[name]'s label, if any): the alert} of the alerts `name` that fire."""
    return {(alert["labels"].get("instance"), alert["labels"].get(TELLS.get(name, ""))): alert
            for alert in alerts(master, name) if alert["state"] == "firing"}


def wait_firing(master, wanted, budget, started):
    """Wait for every alert of `wanted` ({name: {(instance, label)}}) to fire: {name: seconds since `started`}."""
    seen = {}
    for name, keys in wanted.items():
        found = wait_for(f"{name} firing for {sorted(keys, key=str)}", lambda name=name, keys=keys: (
            firing(master, name) if keys <= set(firing(master, name)) else None), budget)
        seen[name] = time.monotonic() - started
        assert keys <= set(found), (name, sorted(found, key=str))
    return seen


def test_faults_with_no_series_of_their_own_raise_alerts(master, workers):
    """Faults that once raised nothing (their rules read series the fault itself removes), made at once on a real
    Prometheus: worker1's node-exporter stopped (LlamaTargetDown); worker2's exporter stopped and its metrics file gone,
    node-exporter still answering (LlamaMetricsMissing, one per series an alert reads); the API front stopped
    (LlamaFrontDown, and LlamaApiUnhealthy: /health through the front fails while llama-server answers)."""
    prom = "/var/lib/prometheus/node-exporter/llama_cluster.prom"
    started = time.monotonic()
    workers["worker1"].check_output("systemctl stop prometheus-node-exporter.service")
    # The service too: a run the timer started a moment ago would write the file again after the rm (seen in CI).
    workers["worker2"].check_output(
        f"systemctl stop llama-cluster-exporter.timer llama-cluster-exporter.service && rm -f {prom}")
    master.check_output("systemctl stop llama-front.service")
    try:
        budget = LOADED * (EXPORTER_INTERVAL + ALERT_AFTER + 4 * SCRAPE_INTERVAL)
        wanted = {"LlamaTargetDown": {("worker1", "llama-node")},
                  "LlamaMetricsMissing": {("worker2", "llama_cluster_worker_up"),
                                          ("worker2", "llama_cluster_worker_connected"),
                                          ("worker2", "llama_cluster_exporter_timestamp_seconds")},
                  "LlamaFrontDown": {("master", "llama-front.service")},
                  "LlamaApiUnhealthy": {("master", "front")}}
        seen = wait_firing(master, wanted, budget, started)
        # /health directly still answers: llama-server itself serves, only the front is down.
        assert ("master", "server") not in firing(master, "LlamaApiUnhealthy")
        assert "llama-front.service on master is not active" in \
            firing(master, "LlamaFrontDown")[("master", "llama-front.service")]["annotations"]["description"]
    finally:
        master.check_output("systemctl start llama-front.service")
        workers["worker2"].check_output("systemctl start llama-cluster-exporter.timer llama-cluster-exporter.service")
        workers["worker1"].check_output("systemctl start prometheus-node-exporter.service")
    wait_health(master, SERVER_PORT, timeout=60)
    wait_for("every alert resolved", lambda: not any(alerts(master, name) for name in wanted),
             LOADED * (EXPORTER_INTERVAL + 4 * SCRAPE_INTERVAL))
    figures("alerts on faults without series of their own (exporter 10 s, scrape 5 s, for: 10 s)",
            [f"{name} fired {seconds:.1f} s after the faults" for name, seconds in seen.items()])


# A request through the front, in the background: its HTTP status goes to /tmp/held.status once answered.
HELD = ("import sys, urllib.request\n"
        "request = urllib.request.Request('http://127.0.0.1:%d/completion', b'{\"prompt\": \"Hi\", \"n_predict\": 2}',"
        " {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + sys.argv[1]})\n"
        "status = urllib.request.urlopen(request, timeout=300).status\n"
        "open('/tmp/held.status', 'w').write(str(status))\n"
        % SERVER_PORT)


def test_a_stopped_llama_server_raises_its_alerts_while_the_front_holds(master):
    """llama-server stopped by hand, one request held by the front: LlamaMasterDown, LlamaApiUnhealthy (/health
    fails directly and through the front) and LlamaFrontHolding fire; started again, the held request is served."""
    wait_health(master, SERVER_PORT)
    master.run("rm -f /tmp/held.status")
    started = time.monotonic()
    master.check_output("systemctl stop llama-server.service")
    try:
        master.check_output(f"nohup python3 -c {quote(HELD)} {quote(API_KEY)} >/dev/null 2>&1 &")
        budget = LOADED * (EXPORTER_INTERVAL + max(ALERT_AFTER, HOLD_ALERT_AFTER) + 4 * SCRAPE_INTERVAL)
        wanted = {"LlamaMasterDown": {("master", None)},
                  "LlamaApiUnhealthy": {("master", "server"), ("master", "front")},
                  "LlamaFrontHolding": {("master", None)}}
        seen = wait_firing(master, wanted, budget, started)
        assert not master.file("/tmp/held.status").exists  # still held
    finally:
        master.check_output("systemctl start llama-server.service")
    wait_for("the held request answered", lambda: master.file("/tmp/held.status").exists, 120)
    assert master.file("/tmp/held.status").content_string == "200"
    wait_for("every alert resolved", lambda: not any(alerts(master, name) for name in wanted),
             LOADED * (EXPORTER_INTERVAL + 4 * SCRAPE_INTERVAL))
    figures(f"alerts on llama-server stopped, a request held (for: 10 s, LlamaFrontHolding {HOLD_ALERT_AFTER} s)",
            [f"{name} fired {seconds:.1f} s after the stop" for name, seconds in seen.items()])


def test_the_exporter_costs_little(workers):
    """One read of a worker by the exporter, as its timer runs it, in CPU-seconds (bash's `time` of the command)."""
    command = ("TIMEFORMAT='%U %S'; time python3 -I /usr/local/lib/llama-cluster-exporter.py "
               "/etc/llama-cluster-exporter.json /tmp/llama_cluster.prom")
    result = workers["worker1"].run(f"bash -c {command!r}")
    assert result.rc == 0, result.stderr
    cpu = sum(map(float, result.stderr.split()[-2:]))
    assert "llama_cluster_worker_connected 1" in workers["worker1"].check_output("cat /tmp/llama_cluster.prom")
    figures("llama-cluster-exporter, one run on a worker", [f"{cpu:.3f} CPU-s"])
    assert cpu < 1, "one exporter run took a CPU-second or more"
