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


def shared(workers, shares):
    """The workers as one instance sees them (llama_instance_shares' {host: {device: fraction}} for it): only the
    devices it uses, each with its part of the device's memory. A host without an entry is taken whole."""
    seen = []
    for worker in workers:
        parts = (shares or {}).get(worker["host"])
        if parts is not None:
            worker = dict(worker, devices=[dict(device, memory_mib=int(int(device["memory_mib"]) * part))
                                           for device in worker.get("devices") or []
                                           for part in [parts.get(device["name"])] if part is not None])
        seen.append(worker)
    return seen


class InstanceError(AnsibleFilterError):
    """A planning error of one instance: its message names the instance and the parts of shared devices it had."""

    def __init__(self, error, instance, parts):
        self.error, self.prefix = error, f"instance {instance!r}: "
        self.suffix = (f" (its parts of shared devices: {', '.join(parts)}; a host's llama_instance_shares sets them)"
                       if parts else "")
        super().__init__(self.render({}))

    def render(self, names):
        message = self.error.render(names) if hasattr(self.error, "render") else self.error.message
        return f"{self.prefix}{message}{self.suffix}"


def plan(host, args):
    """The planning result for `args` (see plugins/modules/llama_plan.py); raises AnsibleFilterError."""
    instance = args.get("instance")
    if not instance:
        return _plan(host, args)
    shares = args.get("shares") or {}
    parts = [f"{worker} {device} {fraction:.0%}" for worker, devices in shares.items()
             for device, fraction in devices.items() if fraction < 1]
    try:
        return _plan(host, dict(args, workers=shared(args.get("workers") or [], shares)))
    except AnsibleFilterError as error:
        raise InstanceError(error, instance, parts) from None


def _plan(host, args):
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
