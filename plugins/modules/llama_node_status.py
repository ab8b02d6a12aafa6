#!/usr/bin/python
"""Ansible module llama_node_status: everything playbooks/status.yml shows of one node, read in one go."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_node_status
short_description: Read the state of one node of a llama.cpp RPC cluster, without changing it
description:
  - One read per node for C(playbooks/status.yml) and C(playbooks/verify.yml), and the source of the node's
    C(llama_cluster_*) metrics. It reads the active build, the project's units, the established TCP connections, the
    memory the units hold, the host's memory and GPUs, the RPC tensor cache, the clock offset and the requests
    the API front holds.
  - Reads only; nothing is started, stopped or written. Missing pieces (a unit that is not installed, no
    chrony, no front) are reported as such, not as failures.
options:
  install_root:
    description: Where the llama.cpp builds are installed; C(<install_root>/current) is the active build.
    type: path
    default: /opt/llama.cpp
  units:
    description: The units to read (C(systemctl show)); a unit that is not installed is reported with
      C(load_state) C(not-found).
    type: list
    elements: str
    default: []
  server_unit:
    description: The unit of llama-server, on the master; its main process's command line is returned.
    type: str
  plan_file:
    description: llama-server's unit, on the master; its C(# llama-cluster-plan:) comment line holds the plan it was
      rendered with (role llama_server).
    type: path
  cache_dir:
    description: The RPC server's tensor cache (C(llama_rpc_cache_dir)); its entries are C(<cache_dir>/rpc/*).
    type: path
  front_socket:
    description: The API front's HAProxy admin socket; the held requests are the sessions of its C(gate) frontend.
    type: path
  health:
    description:
      - llama-server's /health URLs to ask, by path (C(server) directly, C(front) through the API front); each is
        asked with a 3 s timeout.
    type: dict
    default: {}
  chrony:
    description: Read the clock offset from C(chronyc -c tracking).
    type: bool
    default: true
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: The module only reads.
  diff_mode:
    description: Returns what changed (or would change, in check mode) in diff mode.
    support: none
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the worker's state
  llamacpp.rpc_cluster.llama_node_status:
    units: [llama-rpc-server.service, chrony.service]
    cache_dir: /var/cache/llama.cpp
  register: __status
"""

RETURN = r"""
build:
  description: The active build's BUILD-INFO.json (C({}) when there is none).
  returned: success
  type: dict
current:
  description: The directory C(current) resolves to (empty when there is no link).
  returned: success
  type: str
switched:
  description: When C(current) was last pointed somewhere (epoch seconds; 0 when there is no link).
  returned: success
  type: int
units:
  description: Per unit (in the order given) its name, load_state, active_state, sub_state, main_pid, restarts,
    since (epoch seconds the unit last became active, 0 if never), started (epoch seconds its main process started,
    0 when none), memory_bytes (its cgroup's, null when unknown), build_id (LLAMACPP_BUILD_ID of its environment)
    and the raw C(systemctl show) text (show).
  returned: success
  type: list
  elements: dict
cmdline:
  description: llama-server's command line (empty when it has no main process).
  returned: success
  type: list
  elements: str
connections:
  description: The host's established TCP connections, each C([local, peer]) as C(address:port).
  returned: success
  type: list
plan:
  description: The plan of C(plan_file) (model, rpc, plan, hosts), or C({}).
  returned: success
  type: dict
memory:
  description: The host's memory, C({total_bytes, available_bytes}).
  returned: success
  type: dict
gpus:
  description: NVIDIA GPUs seen by nvidia-smi (C({index, name, used_mib, total_mib})); empty without one.
  returned: success
  type: list
cache:
  description: The RPC tensor cache, C({entries, bytes}), or null without C(cache_dir).
  returned: success
  type: dict
clock:
  description: chrony's view, C({offset_s, leap, reference}), or null when chrony does not answer.
  returned: success
  type: dict
front:
  description: The front's C({held, sessions}) (requests the gate holds, connections to the API), or null.
  returned: success
  type: dict
health:
  description:
    - Per path of C(health), what its /health answered, C({url, status, error}); C(status) is null when nothing
      answered, C(error) says why it is not 200 (llama-server's message, or the connection's).
  returned: success
  type: dict
load_s:
  description:
    - Seconds llama-server took from its start to its model loaded (its journal's C(model loaded) line), or null
      (no active llama-server here, still loading, or the journal no longer has the line).
  returned: success
  type: float
loaded:
  description:
    - What llama-server loaded onto each of its devices, from its journal's load log, C({device -> {layers,
      model_bytes}}). C(layers) is null unless llama-server logs at debug level (C(--verbose)); empty without an active
      llama-server here.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils.llama_node import read_node


def main():
    module = AnsibleModule(
        argument_spec={
            "install_root": {"type": "path", "default": "/opt/llama.cpp"},
            "units": {"type": "list", "elements": "str", "default": []},
            "server_unit": {"type": "str"},
            "plan_file": {"type": "path"},
            "cache_dir": {"type": "path"},
            "front_socket": {"type": "path"},
            "chrony": {"type": "bool", "default": True},
            "health": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **read_node(**module.params))


if __name__ == "__main__":
    main()
