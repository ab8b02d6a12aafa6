"""Tags are an interface: `site.yml --tags X` runs the facts and every check, then only part X."""

import pytest
from cluster_helpers import SERVER_PORT, WORKERS, cmdline, main_pid, plays, recap, run_playbook, wait_health

PLAYS = {
    "timesync": "Synchronise the cluster's clocks",
    "build": "Build llama.cpp once per build group and install it on every node",
    "models": "Stage the master's models on local disk",
    "firewall": "Admit the cluster's ports from the cluster only",
    "workers": "Run the RPC server on every worker",
    "master": "Run llama-server on the master over the workers",
    "smoke": "Smoke test - a completion served through the cluster",
}
ALWAYS = ("Preflight - inventory groups", "Variables", "Facts", "Preflight - cluster hosts")
# Ansible validates a role's argument_specs whenever the role is listed, whatever the tags (controller-side).
VALIDATION = "Validating arguments against arg spec"


def run_tags(tags, *args):
    result = run_playbook("site.yml", "--tags", tags, *args)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def tasks_run(output):
    """{play: [tasks]} without Ansible's argument_spec validation."""
    return {play: [task for task in tasks if VALIDATION not in task] for play, tasks in plays(output).items()}


def pids(master, workers):
    return {"master": main_pid(master, "llama-server.service"),
            **{name: main_pid(host, "llama-rpc-server.service") for name, host in workers.items()}}


@pytest.mark.parametrize("tag", PLAYS)
def test_a_tag_runs_the_checks_and_only_its_part(tag, master, workers):
    before = pids(master, workers)
    output = run_tags(tag)
    tasks = tasks_run(output)
    for play in ALWAYS:
        assert tasks[play], f"{play} ran no task under --tags {tag}"
    assert any("Check the listen address" in task or "Check the port" in task
               for task in tasks["Preflight - cluster hosts"])
    for other, play in PLAYS.items():
        if other == tag:
            assert tasks[play], f"--tags {tag} ran nothing in its own play"
        else:
            assert not tasks[play], f"--tags {tag} ran tasks of '{play}': {tasks[play]}"
    assert all(host["changed"] == 0 for host in recap(output).values()), output[-3000:]
    assert pids(master, workers) == before


def test_role_tags_work_too(master):
    tasks = tasks_run(run_tags("llama_server"))
    assert tasks[PLAYS["master"]] and not tasks[PLAYS["workers"]]


def test_master_tag_changes_only_the_master(master, workers):
    """A master-only change applied with --tags master restarts llama-server and nothing else."""
    before = pids(master, workers)
    try:
        output = run_tags("master", "-e", "llama_server_alias=tagged-run")
        stats = recap(output)
        assert stats["master"]["changed"] >= 1 and all(stats[name]["changed"] == 0 for name in WORKERS)
        wait_health(master, SERVER_PORT)
        after = pids(master, workers)
        assert after["master"] != before["master"]
        assert all(after[name] == before[name] for name in WORKERS)
        args = cmdline(master, after["master"])
        assert args[args.index("--alias") + 1] == "tagged-run"
    finally:
        run_tags("master")
    wait_health(master, SERVER_PORT)
    assert "--alias" not in cmdline(master, main_pid(master, "llama-server.service"))
