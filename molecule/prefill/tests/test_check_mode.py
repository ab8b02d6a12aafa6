"""`site.yml --check --diff` with tls on fresh hosts (prepare.yml, before the converge: no CA, no stunnel, no
build) passes and says what it would do. On the converged cluster it changes nothing: test_renewal.py runs it
after the renewal."""

import json
import os
from pathlib import Path

FRESH = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "check-fresh.json"


def changed_tasks(run):
    changed = {}
    for play in run["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if result.get("changed"):
                    changed.setdefault(host, []).append(task["task"]["name"].split(" : ")[-1])
    return changed


def test_fresh_hosts_pass_and_report_the_tls_setup():
    run = json.loads(FRESH.read_text())
    for host, counts in run["stats"].items():
        assert counts["failures"] == 0 and counts["unreachable"] == 0, (host, counts)
    changed = changed_tasks(run)
    assert "Report the CA check mode would create" in sum(changed.values(), [])
    for host in ("master", "worker1", "worker2"):
        assert "Report the packages check mode would install" in changed[host]
        assert "Report the certificate check mode cannot issue yet" in changed[host]
    for worker in ("worker1", "worker2"):
        assert "Install the terminator unit" in changed[worker]
    assert "Install the clients unit" in changed["master"]

