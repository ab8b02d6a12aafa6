"""Every filter of plugins/filter/ has its documentation sidecar (<filter>.yml, what ansible-doc -t filter reads
when a file holds several filters), and it matches the filter: its name, its arguments in order, an example that
uses it and what it returns. No sidecar documents a filter that does not exist."""

import importlib
import inspect
from pathlib import Path

import pytest
import yaml

PLUGINS = Path(__file__).resolve().parents[2] / "plugins" / "filter"
FILTERS = {name: function for path in sorted(PLUGINS.glob("*.py"))
           for name, function in importlib.import_module(f"ansible_collections.llamacpp.rpc_cluster.plugins.filter.{path.stem}")
           .FilterModule().filters().items()}


def test_filters_are_found():
    assert len(FILTERS) > 10, FILTERS


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_filter_has_its_sidecar(name):
    sidecar = PLUGINS / f"{name}.yml"
    assert sidecar.is_file(), f"filter {name} has no documentation: write plugins/filter/{name}.yml"
    doc = yaml.safe_load(sidecar.read_text())
    assert doc["DOCUMENTATION"]["name"] == name
    parameters = list(inspect.signature(FILTERS[name]).parameters)
    assert list(doc["DOCUMENTATION"]["options"]) == ["_input", *parameters[1:]], name
    assert doc["DOCUMENTATION"].get("positional", "") == ", ".join(parameters[1:]), name
    assert name in str(doc["EXAMPLES"]), f"{name}: the example does not use the filter"
    assert doc["RETURN"]["_value"]["description"]


def test_no_sidecar_without_its_filter():
    assert sorted(path.stem for path in PLUGINS.glob("*.yml")) == sorted(FILTERS)
