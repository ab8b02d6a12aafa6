"""Prometheus' configuration as role llama_monitor renders it (Ansible's template module, over an inventory with
the facts playbooks/facts.yml publishes), checked by Debian 12's promtool: every node's exporter under its inventory
name, llama-server's /metrics with the API key from its file, the front's exporter, a node without metrics left
out."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "llama_monitor"


def node(address, enabled=True):
    return {"llama_metrics_scrape": {"enabled": enabled, "target": f"{address}:9100", "port": 9100, "interval": 15,
                                     "sources": ["10.0.0.1"]}}


INVENTORY = {"all": {"children": {
    "llama_master": {"hosts": {"m": {**node("10.0.0.1"), "llama_server_listen": {
        "port": 8080, "allowed_sources": [], "metrics": True, "scrape": "10.0.0.1:8080"},
        "llama_front_listen": {"enabled": True, "metrics_path": "/llama-front/metrics"}}}},
    "llama_workers": {"hosts": {"w1": node("10.0.0.2"), "w2": node("10.0.0.3", enabled=False)}},
    "llama_monitor": {"hosts": {"m": {}}}}}}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    work = tmp_path_factory.mktemp("monitor")
    (work / "hosts.yml").write_text(yaml.safe_dump(INVENTORY))
    (work / "key").write_text("a-key")
    rules = work / "llama-cluster.rules.yml"
    for template, dest in (("llama-cluster.rules.yml.j2", rules), ("prometheus.yml.j2", work / "prometheus.yml")):
        done = subprocess.run(
            ["ansible", "m", "-i", str(work / "hosts.yml"), "-c", "local", "-m", "ansible.builtin.template",
             "-a", f"src={ROLE / 'templates' / template} dest={dest}", "-e", f"@{ROLE / 'defaults' / 'main.yml'}",
             "-e", f"@{ROLE / 'vars' / 'main.yml'}", "-e", f"__llama_monitor_rules={rules}",
             "-e", f"__llama_monitor_key_file={work / 'key'}", "-e", "llama_api_key=a-key",
             "-e", f"ansible_python_interpreter={sys.executable}"],
            cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
        assert done.returncode == 0, done.stdout + done.stderr
    return work / "prometheus.yml"


def test_promtool_accepts_the_configuration(rendered, promtool):
    checked = subprocess.run([promtool, "check", "config", str(rendered)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_jobs_and_their_targets(rendered):
    jobs = {job["job_name"]: job for job in yaml.safe_load(rendered.read_text())["scrape_configs"]}
    assert [(config["targets"], config["labels"]) for config in jobs["llama-node"]["static_configs"]] == [
        (["10.0.0.1:9100"], {"instance": "m", "role": "master"}),
        (["10.0.0.2:9100"], {"instance": "w1", "role": "worker"})]  # w2 exports nothing
    assert jobs["llama-server"]["static_configs"][0]["targets"] == ["10.0.0.1:8080"]
    assert jobs["llama-server"]["authorization"]["credentials_file"].endswith("/key")
    assert "a-key" not in rendered.read_text()
    assert jobs["llama-front"]["metrics_path"] == "/llama-front/metrics"
