"""Roles llama_metrics and llama_monitor on the running cluster, with a real Prometheus on the master (group
llama_monitor): every node's node-exporter is up and serves the llama_cluster_* metrics; every worker is connected;
a stopped worker raises LlamaWorkerDown, which resolves once the cluster has healed; a stranger reaches no exporter
while the monitor does; the exporter costs little CPU."""

import time
import urllib.parse
from shlex import quote

import pytest
from cluster_helpers import (SERVER_PORT, WORKERS, address, connect, http_json, prometheus_query, tcp_connects,
                             wait_health)
from suite_report import figures

NODES = ("master", *WORKERS)
METRICS_PORT = 9100
PROMETHEUS_PORT = 9090
# molecule.yml: the exporter's interval, the scrape (and rule evaluation) interval, the alerts' for:.
EXPORTER_INTERVAL, SCRAPE_INTERVAL, ALERT_AFTER = 10, 5, 10


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
        budget = EXPORTER_INTERVAL + ALERT_AFTER + 2 * SCRAPE_INTERVAL + SCRAPE_INTERVAL
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
