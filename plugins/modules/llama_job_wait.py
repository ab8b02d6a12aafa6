# Documentation of the llama_job_wait action (plugins/action/llama_job_wait.py), run on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_job_wait
short_description: Wait for a job started in the background, showing how far it is
description:
  - Waits for the asynchronous job O(jid) (a task with C(async) and C(poll=0)) to end, like Ansible's own poll.
  - Every O(interval) seconds it reads the end of O(log), where the job writes the build tool's output, and shows
    the last progress mark when it moved, for example C(builder - compile llama.cpp-0c1e570 - 45% after 3 min 20 s);
    ninja's C([n/N]) as steps, make's C([ 45%]) as a percentage, and the text of the last whole C(progress ...)
    line, which the project's own jobs write (a pre-fill, a model load).
  - Returns the job's result (C(rc), C(start), C(end), C(delta) of a command; a module's own return values). Fails
    when the job fails, with a module's message or the last 40 lines of O(log), or when it runs longer than
    O(timeout). A module's result keeps its C(changed); a command's is changed.
options:
  jid:
    description: The job's id (C(ansible_job_id) of the task started with C(poll=0)).
    type: str
    required: true
  log:
    description: The file on the host that holds the job's output.
    type: path
    required: true
  name:
    description: What the job does, for the progress lines.
    type: str
    default: the job
  starting:
    description: What the progress line says before the job's output has a mark.
    type: str
    default: configured, starting
  interval:
    description: Seconds between two looks.
    type: float
    default: 10
  timeout:
    description: Seconds before giving up (the job's own C(async) limit should be the same).
    type: float
    default: 14400
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: none
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Compile in the background
  ansible.builtin.shell:
    cmd: cmake --build build --parallel 4 > build/compile.log 2>&1
  async: 14400
  poll: 0
  register: compile_job

- name: Wait for the compilation, showing its progress
  llamacpp.rpc_cluster.llama_job_wait:
    jid: "{{ compile_job.ansible_job_id }}"
    log: build/compile.log
    name: compile llama.cpp
"""

RETURN = r"""
rc:
  description: The compilation's exit status.
  returned: always
  type: int
delta:
  description: How long the compilation took (H:MM:SS.ffffff).
  returned: always
  type: str
"""
