# Documentation of the llama_validate_vars action (plugins/action/llama_validate_vars.py), run on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_validate_vars
short_description: Check a host's variables against the roles' argument_specs before anything changes
description:
  - Runs on the controller. For each role in O(roles), validates the host's values of the role's own
    variables (the keys of its C(defaults/main.yml)) against its C(meta/argument_specs.yml) main entry
    point (types, element types, choices).
  - Fails on a variable that carries a role's prefix (C(llama_), C(llamacpp_), C(chrony_), ...) but that no
    role declares, suggesting the closest declared name (a typo would otherwise be ignored).
  - Each message names the host, the variable, what it must be and where it is documented.
  - A variable set under the name a role replaced (listed in the role's C(meta/renamed.yml) with the release that
    drops it) still works, with a warning naming the new one; setting both names at once fails.
options:
  roles:
    description: Roles whose variables apply to this host.
    type: list
    elements: str
    required: true
  ignore:
    description: Names with a role prefix that are not variables (facts published by the plays).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check every role's variables
  llamacpp.rpc_cluster.llama_validate_vars:
    roles: [llama, llamacpp, llama_rpc]
"""

RETURN = r"""
errors:
  description: One message per problem.
  returned: failure
  type: list
  elements: str
"""
