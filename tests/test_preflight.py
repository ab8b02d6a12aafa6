"""Inventory mistakes stop site.yml in its first play, before any host is contacted or changed."""

import os
import subprocess

import pytest

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


@pytest.mark.parametrize("old, new, value", [("llama_models_keep", "llama_storage_keep", "0"),
                                             ("llama_models_stage_dir", "llama_storage_stage_dir", "models")])
def test_a_role_s_old_name_and_its_variables_old_names_still_work_with_warnings(tmp_path, project, old, new, value):
    """Role llama_models (llama_storage since 1.1.0) still runs, with a warning naming the new role, and the role
    reads its settings' old names: a bad value given under the old name fails llama_storage's own check."""
    playbook = tmp_path / "old-names.yml"
    playbook.write_text("- name: A playbook written for 1.0.0\n  hosts: localhost\n  gather_facts: false\n"
                        "  tasks:\n    - name: Preflight of the model settings\n"
                        "      ansible.builtin.include_role:\n        name: llama_models\n"
                        "        tasks_from: preflight\n")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    result = subprocess.run(["ansible-playbook", str(playbook), "-i", "localhost,", "-c", "local",
                             "-e", "llama_model_sha256= llama_model_mode=stage llama_model_path=/m.gguf",
                             "-e", f"{old}={value}"],
                            cwd=project, env=env, capture_output=True, text=True, timeout=300)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert ("[WARNING]: role llama_models is deprecated and works until 2.0.0; it is role llama_storage now. "
            "Use that name instead.") in output, output[-3000:]
    shown = {"llama_models_keep": "llama_storage_keep (0) and", "llama_models_stage_dir": "(got 'models')"}[old]
    assert new in output and shown in output, output[-3000:]
