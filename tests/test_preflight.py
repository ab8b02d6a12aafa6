"""Inventory mistakes stop site.yml in its first play, before any host is contacted or changed."""

import importlib.util
import json
import os
import re
import subprocess

from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("llama_validate_vars", PROJECT / "plugins" / "action" /
                                               "llama_validate_vars.py")
validate_vars = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(validate_vars)

HOSTS = "ansible_connection: community.docker.docker\n"


def inventory(tmp_path, masters, workers):
    lines = ["all:", "  children:"]
    for group, hosts in (("llama_master", masters), ("llama_workers", workers)):
        if hosts is None:
            continue
        lines += [f"    {group}:", "      hosts:" + ("" if hosts else " {}")]
        lines += [f"        {host}:" for host in hosts]
    lines += ["  vars:", "    ansible_connection: community.docker.docker",
              "    ansible_host: does-not-exist-{{ inventory_hostname }}"]
    path = tmp_path / "hosts.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


CASES = {
    "no master": ((None, ["w1"]), r"llama_master must hold exactly one host; it holds 0"),
    "two masters": ((["m1", "m2"], ["w1"]), r"llama_master must hold exactly one host; it holds 2: m1, m2"),
    "no workers": ((["m1"], None), r"llama_workers is missing or empty"),
    "empty workers": ((["m1"], []), r"llama_workers is missing or empty"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_inventory_fails_in_preflight(case, tmp_path, project):
    (masters, workers), message = CASES[case]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    result = subprocess.run(["ansible-playbook", "site.yml", "-i", str(inventory(tmp_path, masters, workers))],
                            cwd=project, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert message.replace("\\", "") in " ".join(output.split()), output[-2000:]
    # Only the controller-side play ran: no cluster host was contacted, let alone changed.
    assert "PLAY [Preflight - cluster hosts]" not in output
    assert "does-not-exist" not in output


# Several instances (docs/instances.md) declared wrong: named in the controller's first play, from the inventory alone.
INSTANCE_CASES = {
    "two instances with one name": (
        {"llama_instances": [{"name": "b", "model_path": "/m/a.gguf"}, {"name": "b", "model_path": "/m/b.gguf"}]},
        r"llama_instances[1]: the name 'b' is taken by llama_instances[0]: give each instance its own name"),
    "an instance without a model": (
        {"llama_instances": [{"name": "b", "workers": ["w1"]}]},
        r"instance 'b' (llama_instances[0]) has no model_path: set llama_instances[0].model_path to the GGUF"),
    "two instances claiming one port on one host": (
        {"llama_instances": [{"name": "b", "model_path": "/m/a.gguf", "port": 9000},
                             {"name": "c", "model_path": "/m/b.gguf", "port": 9000}]},
        r"instance 'c': port 9000 on m1 (llama_instances[1].port) is taken by instance 'b' (llama_instances[0].port): "
        r"set llama_instances[1].port to another port"),
    "a worker that is not one": (
        {"llama_instances": [{"name": "b", "model_path": "/m/a.gguf", "workers": ["w3"]}]},
        r"llama_instances[0].workers[0] names 'w3', which is not in llama_workers (w1, w2): add it there"),
    "an unknown instance in a host's variables": (
        {"llama_instances": [{"name": "b", "model_path": "/m/a.gguf"}], "llama_instance_shares": {"c": 0.5}},
        r"w1: llama_instance_shares names the instance 'c', which llama_instances does not declare (default, b): "
        r"name one of them, or remove it"),
}


@pytest.mark.parametrize("case", INSTANCE_CASES)
def test_bad_instances_fail_before_any_host_is_contacted(case, tmp_path, project):
    extra, message = INSTANCE_CASES[case]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    result = subprocess.run(["ansible-playbook", "site.yml", "-i", str(inventory(tmp_path, ["m1"], ["w1", "w2"])),
                             "-e", json.dumps(dict(extra, llama_model_path="/m/own.gguf"))],
                            cwd=project, env=env, capture_output=True, text=True, timeout=300)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert message in output, output[-2000:]
    assert "PLAY [Preflight - cluster hosts]" not in output and "does-not-exist" not in output


def test_a_renamed_variable_still_works_with_a_warning_naming_the_new_one(tmp_path, project):
    """llama_rollback_dir (llama_upgrade_rollback_dir since 1.1.0) passes the variable checks with a warning; set
    beside its new name, it is an error naming both. (The next play would contact the hosts: these do not exist.)"""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    path = inventory(tmp_path, ["m1"], ["w1"])
    commit = "-e llamacpp_commit=" + "0" * 40

    def facts(extra):
        result = subprocess.run(["ansible-playbook", "playbooks/facts.yml", "-i", str(path), *commit.split(), "-e",
                                 extra], cwd=project, env=env, capture_output=True, text=True, timeout=300)
        return result.returncode, " ".join((result.stdout + result.stderr).split())

    code, output = facts("llama_rollback_dir=/srv/upgrade")
    assert code != 0
    assert ("[WARNING]: m1: llama_rollback_dir is deprecated and works until 2.0.0: rename it "
            "llama_upgrade_rollback_dir in the inventory.") in output, output[-3000:]
    assert "ok: [m1]" in output  # the variable checks passed; the failure is the next play's unreachable host
    code, output = facts('{"llama_rollback_dir": "/srv/a", "llama_upgrade_rollback_dir": "/srv/b"}')
    assert code != 0
    assert "m1: both llama_rollback_dir and llama_upgrade_rollback_dir are set" in output, output[-3000:]


def bad_value(name):
    """A value out of the range llama_validate_vars gives the number option `name`."""
    low, high, open_low = validate_vars.bounds(name)
    if high is not None:
        return 70000 if high == 65535 else high + 0.5 if high == 1 else high + 1
    return low if open_low else low - 1


# Every number option of every role, with a value out of its range: one run of the variable checks reports them all.
RANGED = sorted(name for names in validate_vars.number_options(validate_vars.find_roles([PROJECT / "roles"])).values()
                for name in names)


@pytest.fixture(scope="module")
def out_of_range(tmp_path_factory, project):
    """The variable checks' output for an inventory (a master, a worker, a monitor host of its own) given every number
    out of its range: no host is contacted (they do not exist)."""
    path = tmp_path_factory.mktemp("ranges") / "hosts.yml"
    path.write_text("all:\n  children:\n    llama_master: {hosts: {m1: {}}}\n    llama_workers: {hosts: {w1: {}}}\n"
                    "    llama_monitor: {hosts: {mon1: {ansible_host: 10.0.0.9}}}\n  vars:\n"
                    "    ansible_connection: community.docker.docker\n"
                    "    ansible_host: does-not-exist-{{ inventory_hostname }}\n")
    extra = {name: bad_value(name) for name in RANGED}
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    result = subprocess.run(["ansible-playbook", "playbooks/facts.yml", "-i", str(path), "-e",
                             json.dumps(dict(extra, llamacpp_commit="0" * 40))],
                            cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    output = " ".join((result.stdout + result.stderr).split())
    assert "PLAY [Model share]" not in output  # stopped in the variable checks
    return output


@pytest.mark.parametrize("name", RANGED)
def test_a_number_out_of_its_range_is_named_before_any_host_is_contacted(name, out_of_range):
    """llama_metrics_port 70000 once passed preflight and failed in the firewall's template, naming neither the
    variable nor the fix; llama_upgrade_switch_delay -5 passed without a word."""
    value = bad_value(name)
    assert re.search(rf"(m1|w1|mon1): {name} must be .+?, got {re.escape(repr(value))}(\.0)?\. {name}: .* Fix it in the "
                     rf"inventory \(roles/\w+/README\.md\)", out_of_range), out_of_range[-3000:]
    assert "does-not-exist" not in out_of_range
