"""The collection `make collection` builds from the checkout as it is (tools/collection.py: ansible-galaxy collection
build): installed into an empty collections path, with no project configuration, every filter and module is documented under its fully qualified name, the playbooks parse
with every role they use found in the collection, and the project's own references in it are fully qualified;
ansible-test sanity passes on it."""

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import collection  # noqa: E402

FQCN = collection.FQCN


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the collections path it is installed in, an environment that sees it and not the checkout's plugins)."""
    work = tmp_path_factory.mktemp("collection")
    tarball = collection.build(work / "dist")
    (work / "ansible.cfg").write_text("[defaults]\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(work / "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=f"{work / 'collections'}:{Path(yaml.__file__).parents[1]}")
    done = subprocess.run(["ansible-galaxy", "collection", "install", "--offline", "--no-deps", "-p",
                           str(work / "collections"), str(tarball)], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return work, env, tarball


def listed(env, cwd, kind):
    done = subprocess.run(["ansible-doc", "-t", kind, "-l", FQCN, "--json"], cwd=cwd, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    return sorted(yaml.safe_load(done.stdout))


def test_every_filter_and_module_is_documented_by_its_fqcn(installed):
    work, env, _ = installed
    roles, modules, filters = collection.names()
    assert listed(env, work, "filter") == [f"{FQCN}.{name}" for name in filters]
    assert listed(env, work, "module") == [f"{FQCN}.{name}" for name in modules]
    for kind, name in [("filter", name) for name in filters] + [("module", name) for name in modules]:
        done = subprocess.run(["ansible-doc", "-t", kind, f"{FQCN}.{name}"], cwd=work, env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0 and "EXAMPLES" in done.stdout, (name, done.stderr[-2000:])


@pytest.mark.parametrize("playbook", ["site", "upgrade", "status", "verify", "decommission", "bench"])
def test_the_playbooks_parse_with_the_collection_s_roles(installed, playbook):
    work, env, _ = installed
    inventory = work / "hosts.yml"
    inventory.write_text("llama_master:\n  hosts:\n    m:\nllama_workers:\n  hosts:\n    w:\n")
    done = subprocess.run(["ansible-playbook", "--syntax-check", "-i", str(inventory), f"{FQCN}.{playbook}"],
                          cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_project_s_references_are_qualified(installed):
    _, _, tarball = installed
    roles, modules, filters = collection.names()
    short_filter = re.compile(rf"\|\s*({'|'.join(filters)})\b")
    short_module = re.compile(rf"^\s*(?:- )?({'|'.join(modules)}):\s*$", re.M)
    short_role = re.compile(rf"^\s*(?:- )?role:\s+({'|'.join(roles)})\s*$", re.M)
    with tarfile.open(tarball) as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.startswith(("roles/", "playbooks/")) \
                    and member.name.endswith((".yml", ".j2")):
                text = archive.extractfile(member).read().decode()
                # A module's name is a task's key; in a role's meta, defaults and vars the same text is a variable.
                tasks = not any(part in member.name for part in ("/meta/", "/defaults/", "/vars/"))
                for pattern in (short_filter, short_module, short_role) if tasks else (short_filter, short_role):
                    assert not pattern.search(text), (member.name, pattern.search(text).group(0))
            if member.isfile() and member.name.endswith(".py"):
                assert "ansible.module_utils.llama_" not in archive.extractfile(member).read().decode(), member.name
                assert "importlib" not in archive.extractfile(member).read().decode(), member.name


def test_molecule_does_not_install_the_checkout_as_a_collection(tmp_path):
    """The galaxy.yml at the top makes molecule's prerun install this checkout (.venv and all) into
    ~/.ansible/collections before every scenario: it failed CI once, and it would leave files behind the suite."""
    env = dict(os.environ, HOME=str(tmp_path))
    done = subprocess.run([str(Path(sys.executable).parent / "molecule"), "syntax", "-s", "chrony"], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    installed_there = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.glob(".ansible/collections/*/*"))
    assert not installed_there, f"molecule installed {installed_there}: keep `prerun: false` in .config/molecule"


def test_ansible_test_sanity_passes_on_the_built_collection():
    """Every sanity test of ansible-test (their requirements from PyPI, in virtual environments of its own), with only
    the ignore file's entries (tests/sanity/ignore-2.19.txt, each with its reason: its own test fails an entry that is
    no longer needed). The shellcheck test needs the shellcheck package (.ci/run installs it)."""
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "collection.py"), "sanity"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert 'Required program "shellcheck" not found' not in output
