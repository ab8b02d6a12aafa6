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
    changed, cached = {}, None
    for play in fresh_run()["plays"]:
        for task in play["tasks"]:
            name = task["task"]["name"].split(" : ")[-1]  # without the "role : " prefix of a role's tasks
            for host, result in task["hosts"].items():
                if result.get("changed"):
                    changed.setdefault(host, []).append(name)
                if name == "Look for the artifact in the controller cache" and host == "master":
                    cached = result.get("stat", {}).get("exists")
    # The master builds its group's artifact, unless another scenario of the suite (they run at once) stored it in
    # the controller's cache first: the check then installs it from there, which the loop below asserts.
    assert cached is not None, "the master did not look for its group's artifact"
    assert cached or "Report the compilation check mode skips" in changed["master"], changed["master"]
    for host in ("master", "worker1", "worker2"):
        assert "Report the package check mode would install" in changed[host]
        assert "Report the install check mode skips" in changed[host]
    for worker in ("worker1", "worker2"):
        # Without the build, its unit cannot render yet; with the artifact cached, check mode reads the build from
        # there and reports the unit it would install.
        assert "Report the unit check mode cannot render yet" in changed[worker] or (
            cached and any(name.startswith("Install the RPC server unit") for name in changed[worker])), changed[worker]


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
