# Documentation of the llama_deprecated action (action_plugins/llama_deprecated.py), run on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_deprecated
short_description: Warn that a name the collection replaced is still in use
description:
  - Runs on the controller and changes nothing. Shows one warning saying that O(old) is deprecated, works until
    O(removed_in), and is O(new) now.
  - The roles known by another name before 1.1.0 (C(llama_models), C(llama_firewall)) run it first, then the role
    of the new name.
options:
  old:
    description: The old name, as the user wrote it (for example C(role llama_models)).
    type: str
    required: true
  new:
    description: The name that replaces it.
    type: str
    required: true
  removed_in:
    description: The release that drops the old name.
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
  llama_deprecated:
    old: role llama_models
    new: role llama_storage
    removed_in: 2.0.0
"""

RETURN = r"""
msg:
  description: The warning.
  returned: always
  type: str
"""
