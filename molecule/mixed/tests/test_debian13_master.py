"""Last in the mixed scenario, on the cluster upgrade.yml moved to 2cabdd3 with two more instances (test_instances.py):
worker2 (Debian 13) becomes the master of worker1, with the front, the exporters, the monitor and the link check:
every role of the master's runs on Debian 13. The inventory declares no instance: the run removes the units and
firewall rules the instances had on worker1 and worker2."""

import json
import os
import re
import shutil
import time
from pathlib import Path

import yaml

from cluster_helpers import (RPC_PORT, SERVER_PORT, address, assert_refused_in_preflight, http_json, link_rows,
                             prometheus_query, run_playbook, tcp_connects, wait_health)
from mixed_helpers import ASK, B_RPC, NEW_VARS, ledger


def instance_units(workers):
    """{worker: the unit files of other instances there}."""
    return {name: host.run("ls /etc/systemd/system | grep -E '^llama-(rpc-)?server-' | grep -v watch").stdout.split()
            for name, host in workers.items()}


def test_a_debian_13_master_runs_the_master_s_roles(master, workers, tmp_path):
    """site.yml on an inventory where worker2 (Debian 13) is the master and the monitor, over worker1 (Debian 12): the
    model is staged, llama-server runs behind HAProxy 3.0, node-exporter 1.9 and the cluster's exporter feed
    Prometheus 2.53, and the link to worker1 is measured. The same build serves: nothing compiles."""
    answer = http_json(master, SERVER_PORT, "/completion", ASK)["content"]
    # test_instances.py left its instances: b's llama-server on worker2, b's and tiny's RPC servers on worker1.
    assert instance_units(workers) == {"worker1": ["llama-rpc-server-b.service", "llama-rpc-server-tiny.service"],
                                       "worker2": ["llama-server-b.service"]}
    source = Path(os.environ["MOLECULE_INVENTORY_FILE"])
    hosts = yaml.safe_load(source.read_text())["all"]["hosts"]
    shutil.copytree(source.parent / "group_vars", tmp_path / "group_vars")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {name: hosts[name] for name in ("worker1", "worker2")},
        "children": {"llama_master": {"hosts": {"worker2": None}}, "llama_workers": {"hosts": {"worker1": None}},
                     "llama_monitor": {"hosts": {"worker2": None}}}}}))
    compiled = len(ledger())
    settings = json.loads(NEW_VARS) | {"llama_metrics": True, "llama_metrics_interval": 10, "llama_link_check": True,
                                       "llama_monitor_scrape_interval": 5}
    new_master = workers["worker2"]
    # The worker's state directory lets others in (a worker's first upgrade used to create it 0750, which kept a
    # master's llama-server from its staged model: it restarted for the 10 minutes of the play's health wait).
    assert new_master.check_output("stat -c %a /var/lib/llama.cpp") == "755"
    new_master.check_output("chmod 0750 /var/lib/llama.cpp")  # as a worker upgraded by 1.1.0 has it
    try:
        result = run_playbook("site.yml", "-e", json.dumps(settings), inventory=inventory, timeout=600)
    finally:
        new_master.check_output("chmod 0755 /var/lib/llama.cpp")
    assert_refused_in_preflight(result, r"worker2: llama-server, which does not run as root, could not read the "
                                        r"models staged in llama_storage_stage_dir \(/var/lib/llama\.cpp/models\): "
                                        r"/var/lib/llama\.cpp \(mode 750, root:root\) lets only its owner and group "
                                        r"in\. Fix: chmod o\+x /var/lib/llama\.cpp, or set llama_storage_stage_dir")
    # A llama-server that cannot start (here a flag it does not know) fails the play in seconds, with its error,
    # instead of after llama_server_health_timeout (600 s).
    bad = settings | {"llama_server_extra_args": ["--no-such-flag"]}
    began = time.monotonic()
    result = run_playbook("site.yml", "-e", json.dumps(bad), inventory=inventory, timeout=1200)
    output = " ".join((result.stdout + result.stderr).split())
    # At least 3 exits (the wait gives up at the third; a loaded host may see one more before it reads the count).
    exits = re.search(r"llama-server\.service exited (\d+) times in \d+ s since the wait for http://\S+/health began",
                      output)
    assert result.returncode != 0 and exits and int(exits.group(1)) >= 3, output[-4000:]
    assert "--no-such-flag" in output and time.monotonic() - began < 500, output[-4000:]
    result = run_playbook("site.yml", "-e", json.dumps(settings), inventory=inventory, timeout=1200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert len(ledger()) == compiled, ledger()[compiled:]
    # The instances' units are gone where the run ran, and so are their firewall rules (b's RPC port on worker1).
    assert instance_units(workers) == {"worker1": [], "worker2": []}
    assert not tcp_connects(workers["worker2"], address(workers["worker1"]), B_RPC)
    # The link check measured worker1 from the new master.
    link = link_rows(output)
    assert list(link) == ["worker1"] and link["worker1"]["address"] == address(workers["worker1"]), output[-4000:]
    assert float(link["worker1"]["gbits"]) > 0, link
    # llama-server behind the front (HAProxy 3.0), the model staged on local disk, every layer on worker1.
    assert new_master.check_output("haproxy -v | head -1").startswith("HAProxy version 3.0.")
    assert new_master.service("llama-server.service").is_running and new_master.service("llama-front.service").is_running
    served = new_master.check_output("systemctl show -p ExecStart --value llama-server.service")
    assert " -m /var/lib/llama.cpp/models/" in served and f"{address(workers['worker1'])}:{RPC_PORT}" in served, served
    wait_health(new_master, SERVER_PORT)
    assert http_json(new_master, SERVER_PORT, "/completion", ASK)["content"] == answer
    # Prometheus 2.53 scrapes both nodes' node-exporter (1.9 on Debian 13), llama-server and the front; the
    # cluster's exporter on the master sees worker1 connected.
    wanted = {'up{job="llama-node"}': {"worker1": 1, "worker2": 1}, 'up{job="llama-server"}': {"worker2": 1},
              'up{job="llama-front"}': {"worker2": 1}, "llama_cluster_worker_connected": {"worker1": 1}}
    deadline = time.monotonic() + 60
    while (seen := {expr: prometheus_query(new_master, expr) for expr in wanted}) != wanted:
        assert time.monotonic() < deadline, seen
        time.sleep(1)
    assert new_master.check_output("prometheus --version 2>&1 | head -1").startswith("prometheus, version 2.53.")
