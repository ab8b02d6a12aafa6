"""Action plugin llama_plan: order the cluster's devices and plan the split, on the controller.

The planning itself is the tested filters' (plugins/filter/llama_devices.py, plugins/filter/llama_split.py);
this plugin calls them and turns their errors into one message that names the host and the inventory
variables, instead of a templating error around a set_fact.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible.plugins.action import ActionBase
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_devices import llama_device_order, llama_rpc_endpoints
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_split import (llama_split_given, llama_split_plan,
                                                                                 llama_split_table)

# The filter arguments as the inventory calls them.
INVENTORY_NAMES = {
    "ctx_size": "llama_server_ctx_size",
    "reserve_fraction": "llama_split_reserve_fraction",
    "strategy": "llama_split_strategy",
    "tensor_split": "llama_tensor_split",
    "devices": "devices",
    "model": "model",
}


def plan(host, args):
    """The planning result for `args` (see plugins/modules/llama_plan.py); raises AnsibleFilterError."""
    if args.get("workers") is not None:
        workers = list(args["workers"])
        devices = llama_device_order(workers, args.get("local_devices") or [], bool(args.get("master_is_worker")), host)
        rpc = llama_rpc_endpoints(workers)
    else:
        devices, rpc = list(args.get("devices") or []), []
    model = args.get("model")
    options = {"ctx_size": args.get("ctx_size", 4096), "reserve_fraction": args.get("reserve_fraction", 0.15)}
    tensor_split = args.get("tensor_split") or []
    if tensor_split:
        result = llama_split_given(devices, model, tensor_split, **options)
    else:
        result = llama_split_plan(devices, model, strategy=args.get("strategy", "memory"), **options)
    table = llama_split_table(result, devices, model)
    return {"devices": devices, "rpc": rpc, "plan": result, "table": table}


class ActionModule(ActionBase):
    """See plugins/modules/llama_plan.py for the documentation."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        host = (task_vars or {}).get("inventory_hostname", "?")
        names = dict(INVENTORY_NAMES, **(self._task.args.get("names") or {}))
        try:
            planned = plan(host, self._task.args)
        except AnsibleFilterError as err:
            message = err.render(names) if hasattr(err, "render") else err.message
            return dict(result, failed=True, msg=f"{host}: {message}")
        return dict(result, changed=False, **planned)
