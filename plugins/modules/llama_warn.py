# Documentation of the llama_warn action (plugins/action/llama_warn.py), run on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_warn
short_description: Show a warning
description:
  - Runs on the controller and changes nothing. Ansible shows O(msg) as a warning (C([WARNING]:)), in the play's
    output and in its recap of warnings, where a debug message would pass unnoticed.
  - Used for settings that work but should change (a Vulkan SDK a host does not need) and for the old names of
    renamed roles (C(llama_models), C(llama_firewall)), which warn and then run the role of the new name.
options:
  msg:
    description: The warning, naming the host, the setting and what to do.
    type: str
    required: true
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Warn that this role is now llama_storage
  llamacpp.rpc_cluster.llama_warn:
    msg: playbooks/bench.yml is deprecated and works until 2.0.0; it is playbooks/calibrate.yml now
"""

RETURN = r"""
msg:
  description: The warning.
  returned: always
  type: str
"""
