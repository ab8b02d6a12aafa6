"""The cluster's alert rules (role llama_monitor), rendered by Ansible's template module with the role's defaults and
tested by Debian 12's promtool (tools/fixtures.py): each alert fires from the series that mean its problem, after its
`for:`, with its labels and annotations rendered, and a healthy cluster raises none."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "llama_monitor"
ALERTS = ["LlamaTargetDown", "LlamaMetricsMissing", "LlamaWorkerDown", "LlamaWorkerNotConnected",
          "LlamaFewerDevicesThanPlanned", "LlamaMasterDown", "LlamaApiUnhealthy", "LlamaFrontDown",
          "LlamaInstanceUnitDown", "LlamaBuildDrift", "LlamaClockOffset", "LlamaRpcCacheNearCap", "LlamaFrontHolding",
          "LlamaExporterStale"]
HEALTHY = {  # series: values (one every 15 s, 45 of them: 11 minutes)
    'up{job="llama-node",instance="master"}': "1x45",
    'up{job="llama-node",instance="worker1"}': "1x45",
    'up{job="llama-node",instance="worker2"}': "1x45",
    'up{job="llama-front",instance="master"}': "1x45",
    'llama_cluster_api_healthy{instance="master",path="server"}': "1x45",
    'llama_cluster_api_healthy{instance="master",path="front"}': "1x45",
    'llama_cluster_unit_active{instance="master",unit="llama-front.service"}': "1x45",
    'llama_cluster_unit_restarts_total{instance="master",unit="llama-server.service"}': "2x45",
    'llama_cluster_unit_active{instance="master",unit="llama-server.service",llama_instance="default"}': "1x45",
    'llama_cluster_unit_active{instance="worker2",unit="llama-server-b.service",llama_instance="b"}': "1x45",
    'llama_cluster_build_info{instance="worker2",commit="c1"}': "1x45",
    'llama_cluster_exporter_timestamp_seconds{instance="master"}': "0+15x45",
    'llama_cluster_exporter_timestamp_seconds{instance="worker2"}': "0+15x45",
    'llama_cluster_worker_up{instance="worker1"}': "1x45",
    'llama_cluster_worker_up{instance="worker2"}': "1x45",
    'llama_cluster_worker_connected{instance="worker1"}': "1x45",
    'llama_cluster_worker_connected{instance="worker2"}': "1x45",
    'llama_cluster_server_up{instance="master"}': "1x45",
    'llama_cluster_rpc_endpoints_planned{instance="master"}': "2x45",
    'llama_cluster_rpc_endpoints_connected{instance="master"}': "2x45",
    'llama_cluster_build_info{instance="worker1",commit="c1"}': "1x45",
    'llama_cluster_build_info{instance="master",commit="c1"}': "1x45",
    'llama_cluster_clock_offset_seconds{instance="worker2"}': "0.001x45",
    'llama_cluster_rpc_cache_bytes{instance="worker1"}': "100x45",
    'llama_cluster_rpc_cache_max_bytes{instance="worker1"}': "1000x45",
    'llama_cluster_front_held_requests{instance="master"}': "0x45",
    'llama_cluster_exporter_timestamp_seconds{instance="worker1"}': "0+15x45",
}
# alert: (series that change, when it is checked not to fire yet, when it fires, its labels, {$labels...} and $value)
CASES = {
    "LlamaTargetDown": ({'up{job="llama-node",instance="worker2"}': "1 1 0x43"}, "1m", "2m",
                        {"instance": "worker2", "job": "llama-node", "severity": "critical"}, 0),
    # The exporter stopped writing a worker's series (node-exporter still answers): the rule that reads it is blind.
    "LlamaMetricsMissing": ({'llama_cluster_worker_up{instance="worker1"}': "1 1 stale"}, "1m", "2m",
                            {"instance": "worker1", "job": "llama-node", "series": "llama_cluster_worker_up",
                             "severity": "critical"}, 1),
    "LlamaApiUnhealthy": ({'llama_cluster_api_healthy{instance="master",path="server"}': "1 1 0x43"}, "1m", "2m",
                          {"instance": "master", "path": "server", "severity": "critical"}, 0),
    "LlamaFrontDown": ({'llama_cluster_unit_active{instance="master",unit="llama-front.service"}': "1 1 0x43"},
                       "1m", "2m", {"instance": "master", "unit": "llama-front.service", "severity": "critical"}, 0),
    "LlamaInstanceUnitDown": (
        {'llama_cluster_unit_active{instance="worker2",unit="llama-server-b.service",llama_instance="b"}': "1 1 0x43"},
        "1m", "2m", {"instance": "worker2", "unit": "llama-server-b.service", "llama_instance": "b",
                     "severity": "critical"}, 0),
    "LlamaWorkerDown": ({'llama_cluster_worker_up{instance="worker1"}': "1 1 0x43"}, "1m", "2m",
                        {"instance": "worker1", "severity": "critical"}, 0),
    "LlamaWorkerNotConnected": ({'llama_cluster_worker_connected{instance="worker2"}': "1 1 0x43"}, "1m", "2m",
                                {"instance": "worker2", "severity": "critical"}, 0),
    "LlamaFewerDevicesThanPlanned": ({'llama_cluster_rpc_endpoints_connected{instance="master"}': "2 2 1x43"}, "1m",
                                     "2m", {"instance": "master", "severity": "critical"}, 1),
    "LlamaMasterDown": ({'llama_cluster_server_up{instance="master"}': "1 1 0x43"}, "1m", "2m",
                        {"instance": "master", "severity": "critical"}, 0),
    "LlamaBuildDrift": ({'llama_cluster_build_info{instance="master",commit="c1"}': "_x45",
                         'llama_cluster_build_info{instance="master",commit="c2"}': "1x45"}, "4m", "6m",
                        {"severity": "warning"}, 2),
    "LlamaClockOffset": ({'llama_cluster_clock_offset_seconds{instance="worker2"}': "2x45"}, "4m", "6m",
                         {"instance": "worker2", "severity": "warning"}, 2),
    "LlamaRpcCacheNearCap": ({'llama_cluster_rpc_cache_bytes{instance="worker1"}': "950x45"}, "9m", "11m",
                             {"instance": "worker1", "severity": "warning"}, 950),
    "LlamaFrontHolding": ({'llama_cluster_front_held_requests{instance="master"}': "0 0 3x43"}, "2m", "3m",
                          {"instance": "master", "severity": "warning"}, 3),
    "LlamaExporterStale": ({'llama_cluster_exporter_timestamp_seconds{instance="worker1"}': "0x45"}, "2m", "4m",
                           {"instance": "worker1", "severity": "warning"}, None),
}


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    """The rules file as the role installs it (Ansible's template module, the role's defaults, exporters every 15 s)
    for a master and two workers."""
    work = tmp_path_factory.mktemp("rules")
    out = work / "llama-cluster.rules.yml"
    (work / "hosts.ini").write_text("[llama_master]\nmaster\n[llama_workers]\nworker1\nworker2\n")
    done = subprocess.run(
        ["ansible", "master", "-i", str(work / "hosts.ini"), "-c", "local", "-m", "ansible.builtin.template",
         "-a", f"src={ROLE / 'templates' / 'llama-cluster.rules.yml.j2'} dest={out}",
         "-e", f"@{ROLE / 'defaults' / 'main.yml'}", "-e", "__llama_monitor_exporter_interval=15",
         "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_promtool_accepts_the_rules(rules, promtool):
    checked = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = [rule["alert"] for group in yaml.safe_load(rules.read_text())["groups"] for rule in group["rules"]]
    assert names == ALERTS


def annotations(rules, alert, labels, value):
    """The alert's annotations as Prometheus renders them for `labels` and `value`."""
    rule = next(rule for group in yaml.safe_load(rules.read_text())["groups"] for rule in group["rules"]
                if rule["alert"] == alert)
    rendered = {}
    for key, text in rule["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda match: labels.get(match.group(1), ""), text)
        rendered[key] = text.replace("{{ $value }}", "" if value is None else f"{value:g}")
    return rendered


def run_tests(promtool, rules, tmp_path, tests):
    spec = tmp_path / "rules.test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "15s", "tests": tests}))
    done = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def series(changes):
    return [{"series": name, "values": values} for name, values in dict(HEALTHY, **changes).items()]


def test_a_healthy_cluster_raises_no_alert(rules, tmp_path, promtool):
    run_tests(promtool, rules, tmp_path, [{"interval": "15s", "input_series": series({}),
                                 "alert_rule_test": [{"eval_time": "11m", "alertname": name, "exp_alerts": []}
                                                     for name in ALERTS]}])


@pytest.mark.parametrize("alert", CASES)
def test_each_alert_fires_after_its_for(alert, rules, tmp_path, promtool):
    changes, before, after, labels, value = CASES[alert]
    if value is None:  # LlamaExporterStale: no $value in its text
        value = 0
    expected = {"exp_labels": labels, "exp_annotations": annotations(rules, alert, labels, value)}
    run_tests(promtool, rules, tmp_path, [{"interval": "15s", "input_series": series(changes), "alert_rule_test": [
        {"eval_time": before, "alertname": alert, "exp_alerts": []},
        {"eval_time": after, "alertname": alert, "exp_alerts": [expected]}]}])
