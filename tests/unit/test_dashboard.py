"""The Grafana dashboard role llama_monitor ships (files/llama-cluster-dashboard.json; Grafana is not installed here):
its structure as Grafana's import reads it, every query parsed by Debian 12's promtool, and every llama_cluster_*
metric the exporter writes shown on some panel."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "roles" / "llama_monitor" / "files" / "llama-cluster-dashboard.json"


@pytest.fixture(scope="module")
def dashboard():
    return json.loads(DASHBOARD.read_text())


def queries(dashboard):
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_structure_grafana_imports(dashboard):
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    assert [variable["type"] for variable in dashboard["templating"]["list"]] == ["datasource"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        covered = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & covered, f"{panel['title']} overlaps another panel"
        cells |= covered
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        assert [target["refId"] for target in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]


def test_every_metric_of_the_exporter_is_shown(dashboard):
    from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils.llama_node import METRICS
    shown = {name for expr in queries(dashboard) for name in re.findall(r"llama_cluster_\w+", expr)}
    assert shown <= set(METRICS), f"unknown metrics: {shown - set(METRICS)}"
    assert set(METRICS) == shown, f"not shown: {set(METRICS) - shown}"


def test_promtool_parses_every_query(dashboard, tmp_path, promtool):
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{index}", "expr": expr} for index, expr in enumerate(queries(dashboard))]}]}))
    checked = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
