# Documentation of the llama_plan action (plugins/action/llama_plan.py), which runs on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_plan
short_description: Order an RPC cluster's devices as llama.cpp does and plan --device/--tensor-split
description:
  - Runs on the controller. Orders the devices (C(llama_device_order)), lists the C(--rpc) endpoints
    (C(llama_rpc_endpoints)) and plans the split (C(llama_split_plan), or C(llama_split_given) for an explicit
    O(tensor_split)); see plugins/filter/.
  - >-
    A failure is one message that starts with the host and names the inventory variables (O(names)),
    e.g. C(master: llama_split_reserve_fraction must be a number in [0, 1), got 1.5).
options:
  workers:
    description:
      - The workers' C(llama_rpc_worker) facts in C(--rpc) order (C({host, endpoint, devices})).
      - Give either O(workers) or O(devices).
    type: list
    elements: dict
  local_devices:
    description: The master's own devices (only GPUs are used, and only when the master is no worker).
    type: list
    elements: dict
    default: []
  master_is_worker:
    description: The master also runs an RPC server.
    type: bool
    default: false
  devices:
    description: Devices already in llama.cpp order (C({name, memory_mib, speed})), instead of O(workers).
    type: list
    elements: dict
  model:
    description: The model's layout (C(llama_gguf_info)'s C(model)).
    type: dict
    required: true
  ctx_size:
    description: Context size the KV cache is planned for.
    type: int
    default: 4096
  reserve_fraction:
    description: Share of each device's memory kept free.
    type: float
    default: 0.15
  strategy:
    description: C(memory) or C(speed).
    type: str
    default: memory
  tensor_split:
    description: An explicit split, one value per device; empty plans one.
    type: list
    elements: raw
    default: []
  instance:
    description: >-
      The instance planned (C(llama_instances)' name): its errors start with it. Empty for the cluster's one
      llama-server.
    type: str
    default: ""
  shares:
    description: >-
      The instance's part of each worker device (C(llama_instance_shares)' entry for it, C({host: {device:
      fraction}})): a host named here offers only those devices, each with that part of its memory_mib.
    type: dict
    default: {}
  names:
    description: How error messages call each input (C(ctx_size), C(reserve_fraction), C(strategy), C(tensor_split), C(devices), C(model)).
    type: dict
    default: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Plan the split
  llamacpp.rpc_cluster.llama_plan:
    workers: "{{ groups['llama_workers'] | map('extract', hostvars, 'llama_rpc_worker') | list }}"
    model: "{{ __gguf.model }}"
    ctx_size: 8192
  register: __planned
"""

RETURN = r"""
devices:
  description: The devices in llama.cpp's model order (C(llama_device_order)).
  returned: success
  type: list
  elements: dict
rpc:
  description: The C(--rpc) endpoints, in order (empty with O(devices)).
  returned: success
  type: list
  elements: str
plan:
  description: The plan (see C(llama_split_plan)).
  returned: success
  type: dict
table:
  description: The plan as lines of a table (C(llama_split_table)).
  returned: success
  type: list
  elements: str
"""
