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
