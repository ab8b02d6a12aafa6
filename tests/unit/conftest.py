"""The checkout as the collection llamacpp.rpc_cluster (collections/ links back to it): tests import its plugins by
their package, as Ansible does (`from ansible_collections.llamacpp.rpc_cluster.plugins.filter import llama_split`)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(ROOT / "collections"))


def load(name, path):
    """Import a file that is no package's (a tool of tools/) as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def fixture_tool(name, variable):
    """A tool of tools/fixtures.py: $variable (make fixtures sets it), else fetched and cached by tools/fixtures.py
    `name`. A test that needs it fails without it, never skips."""
    path = os.environ.get(variable)
    if not path:
        done = subprocess.run([sys.executable, str(ROOT / "tools" / "fixtures.py"), name], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            pytest.fail(f"{name}: {variable} is not set and tools/fixtures.py {name} failed:\n{done.stderr}")
        path = done.stdout.strip().splitlines()[-1]
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name}: {path} ({variable}) is not an executable file")
    return path


@pytest.fixture(scope="session")
def promtool():
    """Debian 12's promtool, the one role llama_monitor installs."""
    return fixture_tool("promtool", "LLAMA_PROMTOOL")


@pytest.fixture(scope="session")
def haproxy():
    """Debian 12's haproxy, the one role llama_front runs (in the foreground here, never as a service)."""
    return fixture_tool("haproxy", "LLAMA_HAPROXY")
