"""The installed collections satisfy requirements.yml (for users who install from Galaxy instead)."""

import json
import subprocess

import yaml
from ansible.utils.version import SemanticVersion


def satisfies(version, spec):
    ops = {">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
           ">": lambda a, b: a > b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
    for clause in spec.split(","):
        clause = clause.strip()
        op = next(op for op in (">=", "<=", "==", "!=", ">", "<") if clause.startswith(op))
        if not ops[op](SemanticVersion(version), SemanticVersion(clause[len(op):].strip())):
            return False
    return True


def test_installed_collections_satisfy_requirements(project):
    wanted = yaml.safe_load((project / "requirements.yml").read_text())["collections"]
    listing = subprocess.run(["ansible-galaxy", "collection", "list", "--format", "json"],
                             capture_output=True, text=True, check=True).stdout
    installed = {}
    for collections in json.loads(listing).values():
        for name, info in collections.items():
            installed.setdefault(name, info["version"])
    for collection in wanted:
        name, spec = collection["name"], collection["version"]
        assert name in installed, f"{name} is not installed"
        assert satisfies(installed[name], spec), f"{name} {installed[name]} does not satisfy {spec}"
