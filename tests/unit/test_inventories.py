"""The inventories the project ships validate against the roles' argument_specs, as preflight would check them."""

import importlib
import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager
from conftest import ROOT, load

validate_vars = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.action.llama_validate_vars")
ROLES = validate_vars.find_roles([ROOT / "roles"])


@pytest.mark.parametrize("inventory", ["demo", "example"])
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
