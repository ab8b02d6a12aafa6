"""`site.yml --check --diff` works: on fresh hosts (run by prepare.yml, before the converge) it passes the
checks and reports what would change; on the converged cluster it changes nothing and reports nothing, whatever
Debian 12 point release a host is on."""

import json
import os
from pathlib import Path

from cluster_helpers import assert_check_changes_nothing

FRESH = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "check-fresh.json"


def fresh_run():
    return json.loads(FRESH.read_text())


def test_fresh_hosts_pass_preflight_and_report_changes():
    run = fresh_run()
    stats = run["stats"]
    assert set(stats) >= {"master", "worker1", "worker2"}
    for host, counts in stats.items():
        if host == "localhost":
            continue
        assert counts["failures"] == 0 and counts["unreachable"] == 0, (host, counts)
        assert counts["changed"] > 0, f"{host}: check mode reported no change on a fresh host"


def test_fresh_check_names_what_the_build_and_units_would_do():
    changed = {}
    for play in fresh_run()["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if result.get("changed"):
                    # Without the "role : " prefix the JSON callback puts in front of a role's tasks.
                    changed.setdefault(host, []).append(task["task"]["name"].split(" : ")[-1])
    assert "Report the compilation check mode skips" in changed["master"]
    for host in ("master", "worker1", "worker2"):
        assert "Report the package check mode would install" in changed[host]
        assert "Report the install check mode skips" in changed[host]
    for worker in ("worker1", "worker2"):
        assert "Report the unit check mode cannot render yet" in changed[worker]


def test_converged_cluster_reports_no_change_with_a_host_on_another_point_release(workers):
    """A point update (worker1 made to say 12.1 in /etc/debian_version) changes no build either: the build id names
    the release, so nothing is planned on any host (it named the point release, and planned a compilation for worker1
    alone)."""
    worker = workers["worker1"]
    worker.check_output("cp -a /etc/debian_version /root/debian_version.saved && echo 12.1 > /etc/debian_version")
    try:
        assert_check_changes_nothing()
    finally:
        worker.check_output("mv /root/debian_version.saved /etc/debian_version")
