#!/usr/bin/env python3
"""Build the collection llamacpp.rpc_cluster (galaxy.yml) from this checkout: `make collection`.

The checkout keeps its layout (roles/, playbooks/, filter_plugins/, library/, action_plugins/, module_utils/, wired
by ansible.cfg); the collection holds the same files as a collection lays them out, with every reference to the
project's own content made fully qualified, since a collection's roles and playbooks do not find short names:
  roles/, playbooks/        role references (roles:, import_role, include_role), the project's modules and
                            action plugins as task keys, its filters after a `|`, in YAML and templates
  plugins/filter/           filter_plugins/*.py and their doc sidecars (*.yml)
  plugins/modules/          library/*.py (the action plugins' docs too)
  plugins/action/           action_plugins/*.py
  plugins/module_utils/     module_utils/*.py; imports of ansible.module_utils.llama_* point there
  tests/sanity/              ansible-test's ignore file: what the sanity tests report that stays, each with why
Then `ansible-galaxy collection build`. Prints the tarball's path.

  tools/collection.py build [--out DIR]     (default DIR: .cache/collection)
  tools/collection.py sanity [TEST...]      ansible-test sanity on the collection's tree (every test by default)

ansible-test installs each test's requirements into a virtual environment of its own, from PyPI, and bootstraps pip
there with a script it downloads from ci-files.testing.ansible.com, which is not reachable from every machine: the
sanity command puts a stand-in of that script in ansible-test's cache first (pip run from its own wheel, fetched
from PyPI), unless the real one is there.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"
TEXT = {".py", ".yml", ".yaml", ".j2", ".json", ".md", ".cfg", ".lua", ".cmake", ".txt", ".sh", ""}


def names():
    """The project's roles, modules (and action plugins) and filters, by short name."""
    roles = sorted(path.parent.parent.name for path in (ROOT / "roles").glob("*/meta/main.yml"))
    modules = sorted({path.stem for path in (ROOT / "library").glob("*.py")}
                     | {path.stem for path in (ROOT / "action_plugins").glob("*.py")})
    filters = sorted(path.stem for path in (ROOT / "filter_plugins").glob("*.yml"))
    return roles, modules, filters


def qualify(text, roles, modules, filters):
    """YAML or a template with the project's roles, modules and filters fully qualified."""
    role = re.compile(rf"^(\s*(?:- )?(?:role|name):\s+)({'|'.join(map(re.escape, roles))})\s*$")
    lines, after_include = [], False
    for line in text.split("\n"):
        match = role.match(line)
        # `role: X` in a play's roles, `name: X` right under import_role/include_role.
        if match and (line.lstrip().startswith(("role:", "- role:")) or after_include):
            line = f"{match.group(1)}{FQCN}.{match.group(2)}"
        after_include = bool(re.match(r"^\s*(?:- )?(?:ansible\.builtin\.)?(?:import|include)_role:\s*$", line))
        lines.append(line)
    text = "\n".join(lines)
    alternatives = "|".join(map(re.escape, modules))
    text = re.sub(rf"^(\s*(?:- )?)({alternatives}):(\s*)$", rf"\1{FQCN}.\2:\3", text, flags=re.M)
    alternatives = "|".join(map(re.escape, filters))
    return re.sub(rf"(\|\s*)({alternatives})\b", rf"\1{FQCN}.\2", text)


def copy_tree(source, target, transform=None):
    for path in sorted(source.rglob("*")):
        if "__pycache__" in path.parts or path.is_dir():
            continue
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        if transform and path.suffix in TEXT:
            destination.write_text(transform(path.read_text()))
        else:
            shutil.copy2(path, destination)


def stage(where):
    """The collection's tree under `where`/ansible_collections/NS/NAME; returns its directory."""
    roles, modules, filters = names()
    collection = where / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"]
    collection.mkdir(parents=True)
    shutil.copy2(ROOT / "galaxy.yml", collection / "galaxy.yml")
    shutil.copy2(ROOT / "README.md", collection / "README.md")
    shutil.copy2(ROOT / "CHANGELOG.md", collection / "CHANGELOG.md")
    (collection / "meta").mkdir()
    shutil.copy2(ROOT / "meta" / "runtime.yml", collection / "meta" / "runtime.yml")
    yaml_text = lambda text: qualify(text, roles, modules, filters)  # noqa: E731
    python = lambda text: text.replace("ansible.module_utils.llama_",  # noqa: E731
                                       f"ansible_collections.{FQCN}.plugins.module_utils.llama_")
    copy_tree(ROOT / "roles", collection / "roles", yaml_text)
    copy_tree(ROOT / "playbooks", collection / "playbooks", yaml_text)
    copy_tree(ROOT / "filter_plugins", collection / "plugins" / "filter")
    copy_tree(ROOT / "library", collection / "plugins" / "modules", python)
    copy_tree(ROOT / "action_plugins", collection / "plugins" / "action", python)
    copy_tree(ROOT / "module_utils", collection / "plugins" / "module_utils", python)
    copy_tree(ROOT / "tests" / "sanity", collection / "tests" / "sanity")
    return collection


def build(out):
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        collection = stage(Path(tmp))
        done = subprocess.run(["ansible-galaxy", "collection", "build", "--force", "--output-path", str(out),
                               str(collection)], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"collection: ansible-galaxy collection build failed:\n{done.stdout}{done.stderr}")
    return out / f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz"


# ansible-test's pip bootstrap (requirements.py, bootstrap()): a script run with pip's options and the packages to
# install; this one installs them with pip run from its wheel beside it.
PIP_VERSION = "24.2"
GET_PIP = f"""\"\"\"Stand-in for pip's get-pip.py {PIP_VERSION} (written by tools/collection.py sanity): pip installs the
packages asked for, run from its own wheel beside this file.\"\"\"
import glob
import os
import runpy
import sys

wheel = glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pip-{PIP_VERSION}-*.whl"))[0]
sys.path.insert(0, wheel)
sys.argv = ["pip", "install"] + [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
"""


def bootstrap_pip():
    cache = Path.home() / ".ansible" / "test" / "cache"
    script = cache / f"get_pip_{PIP_VERSION.replace('.', '_')}.py"
    if script.exists():
        return
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(cache),
                    f"pip=={PIP_VERSION}"], check=True)
    script.write_text(GET_PIP)


def sanity(tests):
    """ansible-test sanity on the collection's tree; its exit status."""
    bootstrap_pip()
    with tempfile.TemporaryDirectory() as tmp:
        collection = stage(Path(tmp))
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        beside = Path(sys.executable).parent / "ansible-test"  # the virtual environment's, when run from it
        argv = [str(beside) if beside.exists() else "ansible-test", "sanity", "--python", python,
                *(f"--test={test}" for test in tests)]
        return subprocess.run(argv, cwd=collection, check=False).returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    built = sub.add_parser("build", help="build the collection's tarball")
    built.add_argument("--out", type=Path, default=ROOT / ".cache" / "collection")
    checked = sub.add_parser("sanity", help="ansible-test sanity on the collection's tree")
    checked.add_argument("tests", nargs="*", help="only these tests (ansible-test sanity --list-tests)")
    args = parser.parse_args()
    if args.command == "build":
        print(build(args.out))
    else:
        sys.exit(sanity(args.tests))


if __name__ == "__main__":
    main()
