"""Tags are an interface: `site.yml --tags X` runs the facts and every check, then only part X. Several tags at a
time (`--tags X,Y`: parts X and Y, no other), so that each tag is run once and each run has parts it must leave out.
A master-only change applied with tags restarts only llama-server: test_security.py (the key rotation)."""

import pytest
import yaml
from cluster_helpers import PROJECT, plays, recap, run_playbook, service_pids


def site_plays(path=PROJECT / "site.yml"):
    """{tag: the name of its first play} for every play site.yml runs (its imports followed), `always` left out."""
    found = {}
    for entry in yaml.safe_load(path.read_text()):
        imported = entry.get("ansible.builtin.import_playbook")
        if imported:
            for tag, play in site_plays(path.parent / imported).items():
                found.setdefault(tag, play)
            continue
        for tag in entry.get("tags", []):
            if tag != "always":
                found.setdefault(tag, entry["name"])
    return found


# Read from the playbooks: a play with a new tag must be added to RUNS.
PLAYS = site_plays()
# A role's own tag selects that role's tasks wherever the role is listed: llama_server's are in the master's play.
ROLE_TAGS = {"llama_server": "master", "llama_front": "master"}
# Each tag once, in two runs that each leave out four to six parts (the full run of each part is the converge; these runs
# only select), the roles' tags among them.
RUNS = [("timesync", "models", "llama_server", "llama_front", "smoke", "metrics"),
        ("build", "firewall", "workers", "prefill", "master", "monitor")]
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


def test_every_tag_is_run():
    assert {"timesync", "build", "workers", "master", "smoke"} <= set(PLAYS)  # the contract's five
    assert sorted(tag for run in RUNS for tag in run if tag not in ROLE_TAGS) == sorted(PLAYS)


@pytest.mark.parametrize("tags", RUNS, ids=",".join)
def test_tags_run_the_checks_and_only_their_parts(tags, master, workers):
    before = service_pids(master, workers)
    output = run_tags(",".join(tags))
    tasks = tasks_run(output)
    for play in ALWAYS:
        assert tasks[play], f"{play} ran no task under --tags {','.join(tags)}"
    assert any("Check the listen address" in task or "Check the port" in task
               for task in tasks["Preflight - cluster hosts"])
    selected = {ROLE_TAGS.get(tag, tag) for tag in tags}
    for tag, play in PLAYS.items():
        if tag in selected:
            assert tasks[play], f"--tags {','.join(tags)} ran nothing in the play of {tag}"
        else:
            assert not tasks[play], f"--tags {','.join(tags)} ran tasks of '{play}': {tasks[play]}"
    assert all(host["changed"] == 0 for host in recap(output).values()), output[-3000:]
    assert service_pids(master, workers) == before

