"""llama_job_wait (plugins/action/llama_job_wait.py) through Ansible's own async machinery, on this machine: a job
started with `async` and `poll: 0` that writes a build tool's progress marks to its log. The compilations it waits
for in the scenarios take minutes; these jobs take seconds."""

import os
import re
import subprocess
import sys

import pytest

PLAY = """
- name: A job in the background, waited for
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Start the job
      ansible.builtin.shell:
        cmd: "( {command} ) > {log} 2>&1"
      async: 60
      poll: 0
      changed_when: true
      register: job

    - name: Wait for it
      llamacpp.rpc_cluster.llama_job_wait:
        jid: "{{{{ job.ansible_job_id }}}}"
        log: {log}
        name: compile the test job
        interval: 0.5
      register: waited

    - name: Show what it returned
      ansible.builtin.debug:
        msg: "rc={{{{ waited.rc }}}} changed={{{{ waited.changed }}}} delta={{{{ waited.delta }}}}"
"""


def run(tmp_path, project, command):
    playbook = tmp_path / "wait.yml"
    playbook.write_text(PLAY.format(command=command, log=tmp_path / "compile.log"))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    result = subprocess.run(["ansible-playbook", str(playbook), "-i", "localhost,", "-c", "local",
                             "-e", f"ansible_python_interpreter={sys.executable}"], cwd=project,
                            env=env, capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_the_progress_is_shown_while_the_job_runs_and_its_result_returned(tmp_path, project):
    code, output = run(tmp_path, project, "echo '[ 10%] a'; sleep 2; echo '[ 55%] b'; sleep 2; echo '[100%] c'")
    assert code == 0, output[-3000:]
    assert re.search(r"^localhost: compile the test job: 10% after \d+ s$", output, re.M), output[-3000:]
    assert re.search(r"^localhost: compile the test job: 55% after \d+ s$", output, re.M), output[-3000:]
    assert re.search(r"^localhost: compile the test job: done in \d+ s$", output, re.M), output[-3000:]
    assert re.search(r"rc=0 changed=True delta=0:00:0\d", output), output[-3000:]


@pytest.mark.parametrize("command, status", [("echo '[ 20%] a'; sleep 1; echo 'error: boom'; exit 3", 3)])
def test_a_failed_job_fails_the_task_with_the_end_of_its_output(tmp_path, project, command, status):
    code, output = run(tmp_path, project, command)
    assert code != 0
    assert f"localhost: compile the test job failed (exit status {status}); the end of" in output, output[-3000:]
    assert "error: boom" in output, output[-3000:]
