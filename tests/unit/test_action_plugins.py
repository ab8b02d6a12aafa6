"""The controller-side actions: variable validation against the roles' specs, and the planner's messages."""

import importlib
import os
import re

import jinja2
import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.errors import ArgumentTypeError
from ansible.plugins.loader import filter_loader, init_plugin_loader
from conftest import ROOT, load

init_plugin_loader()
filter_loader.add_directory(str(ROOT / "plugins" / "filter"))
validate_vars = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.action.llama_validate_vars")
plan_action = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.action.llama_plan")
ROLES = validate_vars.find_roles([ROOT / "roles"])


def check(values, roles=("llama", "llamacpp", "llama_rpc", "llama_server"), host="worker1"):
    values = {"llamacpp_commit": "0" * 40, **values}
    return validate_vars.validate(host, list(roles), ROLES, values, ignore=["llama_node"])


def test_valid_values_pass():
    assert check({"llama_rpc_port": 50053, "llamacpp_backend": "cuda", "llama_devices": []}) == []


def test_a_type_error_names_host_variable_value_and_the_readme():
    (message,) = check({"llama_rpc_port": "fifty"})
    assert message.startswith("worker1: llama_rpc_port must be an int, got 'fifty'. llama_rpc_port: TCP port")
    assert message.endswith("Fix it in the inventory (roles/llama_rpc/README.md).")


def test_choices_and_element_types():
    messages = check({"llamacpp_backend": "rocm", "llama_devices": ["CUDA0"]})
    assert messages[0].startswith("worker1: llama_devices must be a list of dict items, got ['CUDA0'].")
    assert messages[1].startswith("worker1: llamacpp_backend must be one of: cpu, cuda, hip, vulkan, got: rocm.")


def test_a_required_variable_is_named():
    (message,) = validate_vars.validate("m", ["llamacpp"], ROLES, {})
    assert message.startswith("m: llamacpp_commit must be set. llamacpp_commit: Full 40-hex")


def test_a_misspelt_variable_is_caught_with_a_suggestion():
    (message,) = check({"llama_rpc_prot": 1, "llama_node": {}})
    assert message == ("worker1: llama_rpc_prot is not a variable of any role (did you mean llama_rpc_port?). "
                       "Fix or remove it in the inventory.")


def test_secrets_are_not_echoed():
    error = ArgumentTypeError("argument 'key' is of type dict and we were unable to convert to str")
    options = {"key": {"type": "str", "no_log": True}}
    assert validate_vars.describe(error, options, {"key": {"secret": 1}}) == (
        "key", "key must be a string, got '********'")


def test_only_the_named_roles_variables_are_type_checked():
    assert check({"llama_server_port": "x"}, roles=["llama", "llama_rpc"]) == []


def test_a_renamed_variable_works_with_a_warning_naming_the_new_one():
    values = {"llama_rollback_dir": "/srv/upgrade"}
    assert check(values, roles=("llama", "llama_upgrade")) == []  # known: no "not a variable of any role"
    warnings, errors = validate_vars.renamed_in_use("m", ROLES, values)
    assert errors == [] and warnings == ["m: llama_rollback_dir is deprecated and works until 2.0.0: rename it "
                                         "llama_upgrade_rollback_dir in the inventory."]
    warnings, errors = validate_vars.renamed_in_use("m", ROLES, dict(values, llama_upgrade_rollback_dir="/x"))
    assert warnings == [] and errors[0].startswith("m: both llama_rollback_dir and llama_upgrade_rollback_dir are set")


def expressions(node):
    """Every Jinja expression of a task file's data: the {{ }} spans of its strings, and the bare conditions."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("when", "that", "changed_when", "failed_when", "until") and not isinstance(value, dict):
                yield from (str(item) for item in (value if isinstance(value, list) else [value]))
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)
    elif isinstance(node, str):
        yield from re.findall(r"\{\{.*?\}\}", node, re.S)


@pytest.mark.parametrize("role", sorted(path.parents[1].name for path in ROOT.glob("roles/*/meta/renamed.yml")))
def test_the_renamed_variable_s_value_is_the_one_the_role_uses(role):
    """The role reads each setting through a private name (its vars/main.yml): the old name where the inventory
    sets it, else the new one. No expression of its tasks or templates reads either public name."""
    role = ROOT / "roles" / role
    private = yaml.safe_load((role / "vars" / "main.yml").read_text())
    renamed = yaml.safe_load((role / "meta" / "renamed.yml").read_text())
    environment = jinja2.Environment()
    used = [expression for path in sorted(role.glob("tasks/*.yml")) + sorted(role.glob("handlers/*.yml"))
            for expression in expressions(yaml.safe_load(path.read_text()))]
    used += [text for path in sorted(role.glob("templates/*.j2")) for text in [path.read_text()]]
    used += [str(value) for name, value in private.items() if name not in {f"__{new['name']}" for new in renamed.values()}]
    for old, new in renamed.items():
        template = environment.from_string(private[f"__{new['name']}"])
        assert template.render({old: "old", new["name"]: "new"}) == "old"
        assert template.render({new["name"]: "new"}) == "new"
        assert any(f"__{new['name']}" in text for text in used), f"{role.name} never reads __{new['name']}"
        # A message may name the setting (in a string literal); an expression may not read it.
        offenders = [text for text in used
                     if re.search(rf"(?<!_){new['name']}\b|\b{old}\b", re.sub(r"'[^']*'", "''", text))]
        assert offenders == [], f"{role.name} reads {new['name']} or {old} directly: {offenders}"


def test_ownership_is_the_longest_prefix():
    assert validate_vars.owner("llama_server_port", ROLES) == "llama_server"
    assert validate_vars.owner("llama_split_strategy", ROLES) == "llama"
    assert validate_vars.owner("llamacpp_commit", ROLES) == "llamacpp"
    assert validate_vars.owner("ansible_host", ROLES) is None


WORKERS = [{"host": f"worker{index}", "endpoint": f"10.0.0.{index}:50052",
            "devices": [{"name": "CPU", "memory_mib": 1024, "kind": "cpu"}]} for index in (1, 2)]
MODEL = {"n_layer": 3, "layer_bytes": 10 * 2**20, "output_bytes": 5 * 2**20, "kv_bytes_per_token": 0}


def test_plan_orders_devices_lists_rpc_and_plans():
    result = plan_action.plan("master", {"workers": WORKERS, "model": MODEL, "ctx_size": 512})
    assert result["rpc"] == ["10.0.0.1:50052", "10.0.0.2:50052"]
    assert [device["name"] for device in result["devices"]] == ["RPC0", "RPC1"]
    assert sum(result["plan"]["tensor_split"]) == 4
    assert result["table"][-1].startswith("strategy memory: --device RPC0,RPC1 --tensor-split")


def error_of(args):
    with pytest.raises(AnsibleFilterError) as caught:
        plan_action.plan("master", dict({"workers": WORKERS, "model": MODEL}, **args))
    error = caught.value
    return error.render(plan_action.INVENTORY_NAMES) if hasattr(error, "render") else error.message


def test_planner_errors_name_the_inventory_variables():
    assert error_of({"reserve_fraction": 1.5}) == "llama_split_reserve_fraction must be a number in [0, 1), got 1.5"
    assert error_of({"tensor_split": [1, 2, 3]}).startswith(
        "llama_tensor_split has 3 values but the cluster has 2 devices (RPC0, RPC1)")
    assert error_of({"model": dict(MODEL, layer_bytes=2**30)}).endswith(
        "add a device, lower llama_server_ctx_size or llama_split_reserve_fraction")


def test_workers_sharing_an_endpoint_are_named():
    shared = [dict(WORKERS[0]), dict(WORKERS[1], endpoint=WORKERS[0]["endpoint"])]
    message = error_of({"workers": shared})
    assert "worker1 and worker2 both use 10.0.0.1:50052" in message


def test_the_documentation_stubs_describe_the_actions():
    for name in ("llama_plan", "llama_validate_vars"):
        text = (ROOT / "plugins" / "modules" / f"{name}.py").read_text()
        assert f"module: {name}" in text and os.path.exists(ROOT / "plugins" / "action" / f"{name}.py")


def test_every_number_option_has_a_range():
    """argument_specs types a number; llama_validate_vars.RANGES bounds it (ports by their name). A new number option
    without a range fails here, and so does a range for an option no role has."""
    numbers = {name for names in validate_vars.number_options(ROLES).values() for name in names}
    assert {name for name in numbers if validate_vars.bounds(name) is None} == set()
    assert set(validate_vars.RANGES) <= numbers


@pytest.mark.parametrize("name, value, problem", [
    ("llama_metrics_port", 70000, "llama_metrics_port must be a port number 1-65535, got 70000"),
    ("llama_rpc_port", 0, "llama_rpc_port must be a port number 1-65535, got 0"),
    ("llama_upgrade_switch_delay", -5, "llama_upgrade_switch_delay must be 0 or more, got -5"),
    ("llama_front_hold_seconds", 0, "llama_front_hold_seconds must be at least 1, got 0"),
    ("llama_prefill_rate_mbit", 0, "llama_prefill_rate_mbit must be more than 0, got 0"),
    ("llama_prefill_rate_mbit", "fast", "llama_prefill_rate_mbit must be a number or ~, got 'fast'"),
    ("llama_monitor_cache_warn_fraction", 0, "llama_monitor_cache_warn_fraction must be in (0, 1], got 0"),
    ("llama_split_reserve_fraction", 1.5, "llama_split_reserve_fraction must be in [0, 1], got 1.5"),
    ("chrony_local_stratum", 16, "chrony_local_stratum must be in [1, 15], got 16"),
])
def test_a_number_out_of_range_is_named(name, value, problem):
    assert validate_vars.out_of_range(name, value) == problem


@pytest.mark.parametrize("name, value", [("llama_metrics_port", 65535), ("llama_upgrade_switch_delay", 0),
                                         ("llama_prefill_rate_mbit", None), ("llama_prefill_rate_mbit", 0.5),
                                         ("llama_monitor_cache_warn_fraction", 1), ("llama_server_threads", 0)])
def test_a_number_in_range_passes(name, value):
    assert validate_vars.out_of_range(name, value) is None


def test_a_port_out_of_range_fails_the_variable_checks_with_the_fix():
    [message] = check({"llama_rpc_port": "70000"})  # a string from the command line: converted, then bounded
    assert message.startswith("worker1: llama_rpc_port must be a port number 1-65535, got 70000. llama_rpc_port: ")
    assert message.endswith("Fix it in the inventory (roles/llama_rpc/README.md).")


def test_an_instance_plans_within_its_part_of_shared_devices():
    """A device shared by two instances (llama_instance_shares): each plans within its part, and only on the
    devices it uses; an error names the instance and its parts."""
    workers = [dict(WORKERS[0], devices=[{"name": "CUDA0", "memory_mib": 1024, "kind": "gpu"},
                                         {"name": "CUDA1", "memory_mib": 1024, "kind": "gpu"}]), WORKERS[1]]
    result = plan_action.plan("master", {"workers": workers, "model": MODEL, "instance": "chat",
                                         "shares": {"worker1": {"CUDA1": 0.5}}})
    assert [(device["name"], device["local_name"], device["memory_mib"]) for device in result["devices"]] == [
        ("RPC0", "CUDA1", 512), ("RPC1", "CPU", 1024)]
    with pytest.raises(AnsibleFilterError) as caught:
        plan_action.plan("master", {"workers": workers, "model": dict(MODEL, layer_bytes=2**30), "instance": "chat",
                                    "shares": {"worker1": {"CUDA1": 0.5}}})
    message = caught.value.render(plan_action.INVENTORY_NAMES)
    assert message.startswith("instance 'chat': model needs "), message
    assert "short by" in message and message.endswith(
        "(its parts of shared devices: worker1 CUDA1 50%; a host's llama_instance_shares sets them)"), message
