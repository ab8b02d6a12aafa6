"""tools/bench.py's readers on real input: Ansible's profile_tasks summary of a real run and its controller CPU,
the build ledger's lines as the llamacpp role writes them, and the scaled demo inventory P9 converges (read back by
ansible-inventory)."""

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import bench  # noqa: E402  # pylint: disable=wrong-import-position

PLAYBOOK = """- name: Two tasks
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: A slow task
      ansible.builtin.command: sleep 1
      changed_when: false
    - name: A quick task
      ansible.builtin.debug:
        msg: hello
"""


def test_each_run_s_slowest_tasks_come_from_ansible_s_profile(tmp_path):
    playbook = tmp_path / "two.yml"
    playbook.write_text(PLAYBOOK)
    seconds, output, profile = bench.timed_playbook("localhost,", str(playbook), "-e",
                                                    f"ansible_python_interpreter={sys.executable}")
    assert "A slow task" in output and seconds >= 1.0
    # ansible-playbook's own CPU (a second at most here: it sleeps), not the wall time.
    assert 0 < profile["controller_cpu_s"] < seconds
    slowest = profile["slowest"]
    assert [task for task, _ in slowest] == ["A slow task", "A quick task"], output[-2000:]
    assert slowest[0][1] >= 1.0 > slowest[1][1]


def test_the_ledger_gives_each_compilation_s_host_and_seconds(tmp_path):
    (tmp_path / "builds.log").write_text(
        "2026-12-05T06:38:55.780237 llama.cpp-0c1e57098bba-cpu-debian12-x86_64-d66281cd4ee4 compiled on master in "
        "0:04:42.431530, ccache answered 0 of 208 compilations\n"
        "2026-12-05T07:01:02.000001 llama.cpp-0c1e57098bba-cpu-debian12-x86_64-0123456789ab compiled on worker1 in "
        "1:00:03.500000\n")
    assert bench.ledger(tmp_path) == [
        ("llama.cpp-0c1e57098bba-cpu-debian12-x86_64-d66281cd4ee4", "master", 282.43153,
         "ccache answered 0 of 208 compilations"),
        ("llama.cpp-0c1e57098bba-cpu-debian12-x86_64-0123456789ab", "worker1", 3603.5, "")]
    assert not bench.ledger(tmp_path / "absent")


def test_the_scaled_inventory_is_the_demo_s_with_n_workers(tmp_path):
    inventory = bench.scaled_inventory(tmp_path / "12", 12)
    listing = json.loads(subprocess.run(["ansible-inventory", "-i", inventory, "--list"], check=True,
                                        capture_output=True, text=True, cwd=bench.ROOT).stdout)
    groups = {name: group.get("hosts", []) for name, group in listing.items() if isinstance(group, dict)}
    assert groups["llama_master"] == ["master"]
    assert groups["llama_workers"] == [f"worker{index}" for index in range(1, 13)]
    assert (tmp_path / "12" / "group_vars").resolve() == bench.DEMO / "group_vars"
