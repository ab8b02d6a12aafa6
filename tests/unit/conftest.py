"""Make the plugins and module_utils importable as plain modules (`import llama_split`, `import llama_gguf`)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(ROOT / "filter_plugins"))


def load(name, path):
    """Import a file directly, without Ansible's module_utils loader."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


load("llama_gguf", ROOT / "module_utils" / "llama_gguf.py")
# The node reader, also as the module llama_node_status imports it.
sys.modules["ansible.module_utils.llama_node"] = load("llama_node", ROOT / "module_utils" / "llama_node.py")
load("llama_device_info", ROOT / "library" / "llama_device_info.py")
load("llama_node_status", ROOT / "library" / "llama_node_status.py")
