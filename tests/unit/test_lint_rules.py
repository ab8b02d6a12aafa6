"""The project's conventions as ansible-lint rules (tools/lint_rules, enabled by .ansible-lint, run by make lint):
a task of each kind they catch is reported, with the project's own configuration, and what they must not catch is
not."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PLAYBOOK = """---
- name: A play
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Check something loudly
      ansible.builtin.assert:
        that: true
        fail_msg: it failed
    - name: Check something quietly
      ansible.builtin.assert:
        that: true
        fail_msg: it failed
        quiet: true
    - name: Store the key where -v prints it
      ansible.builtin.copy:
        content: "{{ llama_api_key }}\\n"
        dest: /tmp/key
        mode: "0600"
    - name: Store the key quietly
      ansible.builtin.copy:
        content: "{{ llama_api_key }}\\n"
        dest: /tmp/key
        mode: "0600"
      no_log: true
    - name: Say whether there is a key
      ansible.builtin.debug:
        msg: "{{ llama_api_key | length > 0 }}"
"""


def test_the_project_s_rules_catch_what_they_guard(tmp_path):
    shutil.copy2(ROOT / ".ansible-lint", tmp_path / ".ansible-lint")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "lint_rules").symlink_to(ROOT / "tools" / "lint_rules")
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-lint"), "--nocolor", "play.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    reported = sorted(line.split(":", 1)[0] for line in output.splitlines() if line.startswith("llama-"))
    assert reported == ["llama-api-key-no-log", "llama-assert-quiet"], output
    assert "play.yml:6" in output and "play.yml:15" in output, output  # the loud assert, the logged key
