"""The inventories the project ships validate against the roles' argument_specs, as preflight would check them."""

import importlib
import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager
from conftest import ROOT, load

validate_vars = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.action.llama_validate_vars")
ROLES = validate_vars.find_roles([ROOT / "roles"])


@pytest.mark.parametrize("inventory", ["demo", "example", "instances"])
def test_inventory_variables_are_valid(inventory):
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(ROOT / "inventory" / inventory)])
    variables = VariableManager(loader=loader, inventory=manager)
    hosts = manager.get_hosts()
    assert hosts
    for host in hosts:
        values = {name: value for name, value in variables.get_vars(host=host).items()
                  if validate_vars.owner(name, ROLES)}
        groups = {group.name for group in host.get_groups()}
        roles = ["llama", "llamacpp", "chrony"] + (["llama_rpc"] if "llama_workers" in groups else []) \
            + (["llama_server"] if "llama_master" in groups else [])
        assert validate_vars.validate(host.name, roles, ROLES, values) == []


def test_the_instances_example_declares_two_models_and_two_replicas():
    """inventory/instances passes the instances' own checks (llama_instances, llama_instance_shares)."""
    filters = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_instances")
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(ROOT / "inventory" / "instances")])
    variables = VariableManager(loader=loader, inventory=manager)
    values = {host.name: variables.get_vars(host=host) for host in manager.get_hosts()}
    master, workers = manager.groups["llama_master"].hosts[0].name, [host.name for host in
                                                                      manager.groups["llama_workers"].hosts]
    own = values[master]
    found = filters.llama_instances(own["llama_instances"], {
        "model_path": own["llama_model_path"], "served_name": own["llama_server_alias"], "port": 8081,
        "ctx_size": own["llama_server_ctx_size"]}, master, workers, {name: {"rpc_port": 50052} for name in workers})
    assert [(instance["name"], instance["served_name"], instance["replicas"]) for instance in found] == [
        ("default", "llama-3.1-70b", ["default", "replica"]), ("replica", "llama-3.1-70b", ["default", "replica"]),
        ("coder", "qwen2.5-coder-7b", ["coder"])]
    shares = filters.llama_instance_shares(found, {name: ["CUDA0"] for name in workers},
                                           {name: vars_.get("llama_instance_shares", {})
                                            for name, vars_ in values.items()})
    assert shares["default"]["gpu-box-3"] == {"CUDA0": 0.6} and shares["replica"]["gpu-box-3"] == {"CUDA0": 0.4}
    assert shares["default"]["gpu-box-4"] == {"CUDA0": 0.5}  # shared evenly with coder
