#!/usr/bin/env python3
"""The checkout is the collection llamacpp.rpc_cluster (galaxy.yml): roles/, playbooks/, plugins/{action,filter,
modules,module_utils}/, meta/runtime.yml, with fully qualified names in the source. collections/ansible_collections/
llamacpp/rpc_cluster links back to the checkout, which is how ansible.cfg (collections_path) finds it in place.

  tools/collection.py build [--out DIR]     `ansible-galaxy collection build` on the checkout (galaxy.yml's
                                            build_ignore leaves out what only develops it); prints the tarball's path
                                            (default DIR: .cache/collection)
  tools/collection.py sanity [TEST...]      ansible-test sanity on the collection (every test by default)

ansible-test runs only inside a directory named ansible_collections/NAMESPACE/NAME, which a checkout's directory is
not (and it resolves links): the sanity command unpacks what `build` makes of the checkout there, the files as they
are, and runs it on those. ansible-test installs each test's requirements into a virtual environment of its own, from
PyPI, and bootstraps pip there with a script it downloads from ci-files.testing.ansible.com, which is not reachable
from every machine: the sanity command puts a stand-in of that script in ansible-test's cache first (pip run from its
own wheel, fetched from PyPI), unless the real one is there.
"""

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"


def names():
    """The project's roles, modules (and action plugins) and filters, by short name."""
    roles = sorted(path.parent.parent.name for path in (ROOT / "roles").glob("*/meta/main.yml"))
    modules = sorted({path.stem for path in (ROOT / "plugins" / "modules").glob("*.py")}
                     | {path.stem for path in (ROOT / "plugins" / "action").glob("*.py")})
    filters = sorted(path.stem for path in (ROOT / "plugins" / "filter").glob("*.yml"))
    return roles, modules, filters


def build(out):
    """`ansible-galaxy collection build` of the checkout into `out`: the tarball's path."""
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["ansible-galaxy", "collection", "build", "--force", "--output-path", str(out), str(ROOT)],
                          capture_output=True, text=True, check=False)
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
    """ansible-test sanity on the collection built from the checkout; its exit status."""
    bootstrap_pip()
    with tempfile.TemporaryDirectory() as tmp:
        tarball = build(Path(tmp) / "dist")
        collection = Path(tmp) / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"]
        collection.mkdir(parents=True)
        with tarfile.open(tarball) as archive:
            archive.extractall(collection)  # our own build
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
