#!/usr/bin/python
"""Ansible module llama_gguf_info: read a GGUF model's planning facts on the host that holds it."""

DOCUMENTATION = r"""
module: llama_gguf_info
short_description: Read the layer sizes and KV cache size of a GGUF model
description:
  - Reads the header, metadata and tensor table of a GGUF file (never the tensor data) with the Python
    standard library only, and returns the C(model) dict the C(llama_split_plan) filter takes.
  - For a split model (C(split.count) > 1, files named C(NAME-00001-of-00003.gguf)) every shard is read;
    any shard may be given.
  - Never changes anything.
options:
  path:
    description: Path of the GGUF file on the managed host.
    type: path
    required: true
  cache_type_k:
    description: KV cache type of K (llama.cpp C(--cache-type-k)), used to size C(kv_bytes_per_token).
    type: str
    default: f16
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl]
  cache_type_v:
    description: KV cache type of V (llama.cpp C(--cache-type-v)), used to size C(kv_bytes_per_token).
    type: str
    default: f16
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl]
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Returns what changed (or would change, in check mode) in diff mode.
    support: none
notes:
  - The output layer's bytes include C(token_embd.weight) when the model has tied embeddings (no
    C(output.weight)), because llama.cpp then loads that matrix a second time on the output layer's device.
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the model's planning facts
  llamacpp.rpc_cluster.llama_gguf_info:
    path: /srv/models/Llama-3.1-70B-Q4_K_M-00001-of-00002.gguf
    cache_type_k: q8_0
    cache_type_v: q8_0
  register: __llama_gguf

- name: Plan the split
  ansible.builtin.set_fact:
    __llama_plan: "{{ __llama_devices | llamacpp.rpc_cluster.llama_split_plan(__llama_gguf.model, ctx_size=8192) }}"
"""

RETURN = r"""
model:
  description: Input of the C(llama_split_plan) filter.
  returned: success
  type: dict
  contains:
    n_layer:
      description: Number of repeating layers (C({arch}.block_count)).
      type: int
    layer_bytes:
      description: Weight bytes of each layer (the tensors named C(blk.N.*)).
      type: list
      elements: int
    output_bytes:
      description: Weight bytes of the output layer (C(output.*), C(output_norm.*), and C(token_embd.weight) if tied).
      type: int
    kv_bytes_per_token:
      description: K+V cache bytes per token of each layer.
      type: list
      elements: int
  sample:
    n_layer: 2
    layer_bytes: [1050624, 1050624]
    output_bytes: 1024000
    kv_bytes_per_token: [1024, 1024]
gguf:
  description: Other facts read from the file.
  returned: success
  type: dict
  contains:
    architecture:
      description: C(general.architecture).
      type: str
    n_embd:
      description: Embedding length.
      type: int
    n_head:
      description: Attention heads (an int, or a list per layer as in the file).
      type: raw
    n_head_kv:
      description: KV heads (an int, or a list per layer as in the file); defaults to n_head.
      type: raw
    key_length:
      description: K head size; defaults to n_embd / n_head.
      type: int
    value_length:
      description: V head size; defaults to n_embd / n_head.
      type: int
    context_length:
      description: Training context length, null when the file has none.
      type: int
    tied_embeddings:
      description: Whether the model has no C(output.weight) and reuses C(token_embd.weight).
      type: bool
    other_bytes:
      description: Bytes of tensors outside the layers and the output (mostly C(token_embd.weight), kept on the CPU).
      type: int
    file_bytes:
      description: Total size of the file(s).
      type: int
    files:
      description: Paths of all shards, in order.
      type: list
      elements: str
    tensor_count:
      description: Number of tensors in all shards.
      type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils.llama_gguf import CACHE_TYPE_SIZES, MODEL_KEYS, GGUFError, read_model_info


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "cache_type_k": {"type": "str", "default": "f16", "choices": list(CACHE_TYPE_SIZES)},
            "cache_type_v": {"type": "str", "default": "f16", "choices": list(CACHE_TYPE_SIZES)},
        },
        supports_check_mode=True,
    )
    try:
        info = read_model_info(module.params["path"], module.params["cache_type_k"], module.params["cache_type_v"])
    except GGUFError as err:
        module.fail_json(msg=str(err))
    model = {key: info[key] for key in MODEL_KEYS}
    facts = {key: value for key, value in info.items() if key not in MODEL_KEYS}
    module.exit_json(changed=False, model=model, gguf=facts)


if __name__ == "__main__":
    main()
