"""The collections the project uses are the ones it declares.

Runtime: every collection whose content the roles, the playbooks (site.yml and upgrade.yml too), the plugins and
ansible.cfg name by FQCN is in galaxy.yml's `dependencies` and in requirements.yml, with the same bounds, and
nothing else is. Test-only: what molecule/, tests/ and tools/ (the demo, the bench) use on top of that is in
tests/requirements.yml. ansible.builtin (and ansible.legacy) and the project's own collection are not declared.

What counts as a use: a module or action as a task's key (`community.crypto.openssl_privatekey:`), the value of
`action:`, `module_defaults`' keys, a role by FQCN, a filter, test or lookup in Jinja (`| community.general.dict_kv`,
`is ns.name.test`, `lookup('ns.name.x')`), a callback, connection, become or strategy plugin named in a setting
(`ANSIBLE_STDOUT_CALLBACK: ansible.posix.json`, `ansible_connection: community.docker.docker`), a Python import from
`ansible_collections.<namespace>.<name>`.
"""

import configparser
import re
from pathlib import Path

import pytest
import yaml
from ansible.playbook.block import Block
from ansible.playbook.handler import Handler

ROOT = Path(__file__).resolve().parents[2]
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
NOT_DECLARED = {"ansible.builtin", "ansible.legacy", f"{GALAXY['namespace']}.{GALAXY['name']}"}

NAME = r"[a-z_][a-z0-9_]*"
FQCN = rf"{NAME}\.{NAME}\.{NAME}(?:\.{NAME})*"
JINJA = [re.compile(rf"\|\s*({FQCN})\b"),
         re.compile(rf"\bis\s+(?:not\s+)?({FQCN})\b"),
         re.compile(rf"\b(?:lookup|query|q)\(\s*['\"]({FQCN})['\"]"),
         # A filter or a test by name: map('ns.name.filter', ...), selectattr('key', 'ns.name.test', ...).
         re.compile(rf"\b(?:map|select|reject)\(\s*['\"]({FQCN})['\"]"),
         re.compile(rf"\b(?:selectattr|rejectattr)\(\s*['\"][^'\"]*['\"]\s*,\s*['\"]({FQCN})['\"]")]
# Settings whose value names plugins, recognised in any text (an environment variable, an inventory variable, a
# Python dict of either), any case: names no other code uses.
TEXT_SETTINGS = {"ansible_connection", "ansible_become_method", "ansible_strategy", "ansible_stdout_callback",
                 "ansible_callbacks_enabled", "ansible_callback_whitelist", "stdout_callback", "callbacks_enabled",
                 "callback_whitelist"}
SETTING_IN_TEXT = re.compile(
    rf"\b({'|'.join(sorted(TEXT_SETTINGS))})[\"']?\s*[:=]\s*[\"']?((?:{FQCN}\s*,\s*)*{FQCN})\b", re.IGNORECASE)
# ... and, as YAML keys, the keywords whose value is a plugin, a role or a playbook.
YAML_SETTINGS = TEXT_SETTINGS | {"action", "local_action", "connection", "become_method", "strategy",
                                 "import_playbook", "ansible.builtin.import_playbook"}
IMPORT = re.compile(rf"^\s*(?:from|import)\s+ansible_collections\.({NAME}\.{NAME})\b", re.M)
TASK_KEYWORDS = set(Handler.fattributes) | set(Block.fattributes) | {"local_action"}
TASK_LISTS = {None, "tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"}
YAML_SUFFIXES = {".yml", ".yaml"}


class _AnyTagLoader(yaml.SafeLoader):
    """Reads `!unsafe`, `!vault` and the like as their plain value."""


_AnyTagLoader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                                    if isinstance(node, yaml.ScalarNode) else None)


def collection(fqcn):
    return ".".join(fqcn.removeprefix("group/").split(".")[:2])


def plugin_names(value):
    """The FQCNs of a setting's value (one, or several separated by commas)."""
    return {name.strip() for name in value.split(",") if re.fullmatch(FQCN, name.strip())}


def uses_in_text(text):
    """FQCNs named in Jinja expressions and plugin settings of a string (a template, a YAML value, Python)."""
    found = {match.group(1) for pattern in JINJA for match in pattern.finditer(text)}
    for match in SETTING_IN_TEXT.finditer(text):
        found |= plugin_names(match.group(2))
    return found


def uses_in_yaml(data, parent=None, in_list=False):
    """FQCNs that a loaded YAML document (plays, tasks, variables) uses."""
    found = set()
    if isinstance(data, dict):
        keys = [key for key in data if isinstance(key, str)]
        others = [key for key in keys if key not in TASK_KEYWORDS and not key.startswith("with_")]
        # A task (in a list of tasks, or named): one key that is not a keyword, its action. A list of data whose
        # keys have dots (sysctl's net.ipv4.ip_forward) is not one.
        if in_list and (parent in TASK_LISTS or "name" in data) and len(others) == 1 \
                and re.fullmatch(FQCN, others[0]):
            found.add(others[0])
        if parent == "module_defaults":
            found |= {key for key in keys if re.fullmatch(rf"(?:group/)?{FQCN}", key)}
        if parent == "roles" or str(parent).endswith(("import_role", "include_role")):
            role = data.get("role", data.get("name"))
            if isinstance(role, str) and re.fullmatch(FQCN, role):
                found.add(role)
        for key, value in data.items():
            found |= uses_in_yaml(value, parent=key)
    elif isinstance(data, list):
        for item in data:
            found |= uses_in_yaml(item, parent=parent, in_list=True)
    elif isinstance(data, str):
        found |= uses_in_text(data)
        setting = str(parent).lower()
        if setting in YAML_SETTINGS or (parent == "roles" and in_list):
            # `action: community.general.x arg=1`: the plugin is the first word.
            found |= plugin_names(data.split()[0] if setting in ("action", "local_action") and data.split() else data)
        if parent == "collections" and in_list and re.fullmatch(rf"{NAME}\.{NAME}", data):
            found.add(f"{data}._")
    return found


def uses_in_file(path):
    text = path.read_text()
    if path.suffix == ".py":
        return uses_in_text(text) | {f"{name}._" for name in IMPORT.findall(text)}
    if path.suffix in YAML_SUFFIXES:
        found = set()
        for document in yaml.load_all(text, Loader=_AnyTagLoader):
            found |= uses_in_yaml(document)
        return found
    return uses_in_text(text)


def uses_in_ansible_cfg(path):
    config = configparser.ConfigParser(interpolation=None)
    config.read(path)
    return {name for section in config.sections() for option, value in config.items(section)
            if option in YAML_SETTINGS for name in plugin_names(value)}


def collections_used(paths):
    """{collection: sorted ["path: FQCN", ...]} of the files and directories in `paths`, declared ones aside."""
    used = {}
    for top in paths:
        files = sorted(top.rglob("*")) if top.is_dir() else [top]
        for path in files:
            # This file's samples are not uses.
            if "__pycache__" in path.parts or not path.is_file() or path == Path(__file__).resolve():
                continue
            if path.name == "ansible.cfg":
                found = uses_in_ansible_cfg(path)
            elif path.suffix in YAML_SUFFIXES | {".j2", ".py"}:
                found = uses_in_file(path)
            else:
                continue
            for fqcn in found:
                if collection(fqcn) not in NOT_DECLARED:
                    used.setdefault(collection(fqcn), set()).add(f"{path.relative_to(ROOT)}: {fqcn}")
    return {name: sorted(where) for name, where in sorted(used.items())}


RUNTIME = [ROOT / "site.yml", ROOT / "upgrade.yml", ROOT / "ansible.cfg", ROOT / "roles", ROOT / "playbooks",
           ROOT / "plugins"]
TEST_ONLY = [ROOT / "molecule", ROOT / "tests", ROOT / "tools", ROOT / ".config"]


def declared(source):
    data = yaml.safe_load((ROOT / source).read_text())
    if source == "galaxy.yml":
        return dict(data.get("dependencies") or {})
    return {entry["name"]: entry["version"] for entry in data.get("collections") or []}


def test_every_collection_the_roles_and_playbooks_use_is_declared():
    used = collections_used(path for path in RUNTIME if path.exists())
    for source in ("galaxy.yml", "requirements.yml"):
        missing = {name: where for name, where in used.items() if name not in declared(source)}
        assert not missing, (f"used by the roles and playbooks but not declared in {source} (add them, with the "
                             f"version range of the installed `ansible` package): {missing}")


def test_no_collection_is_declared_that_the_roles_and_playbooks_do_not_use():
    used = collections_used(path for path in RUNTIME if path.exists())
    for source in ("galaxy.yml", "requirements.yml"):
        unused = sorted(set(declared(source)) - set(used))
        assert not unused, (f"{source} declares {unused}, which no role, playbook or plugin uses: drop them, or move "
                            "them to tests/requirements.yml if only the tests, the demo or the bench need them")


def test_galaxy_and_requirements_declare_the_same_bounds():
    assert declared("galaxy.yml") == declared("requirements.yml")


def test_every_collection_the_tests_demo_and_bench_use_is_declared():
    runtime, test_only = declared("requirements.yml"), declared("tests/requirements.yml")
    assert not set(runtime) & set(test_only), "tests/requirements.yml repeats runtime collections of requirements.yml"
    used = collections_used(path for path in TEST_ONLY if path.exists())
    missing = {name: where for name, where in used.items() if name not in runtime and name not in test_only}
    assert not missing, f"used by the tests, the demo or the bench but not in tests/requirements.yml: {missing}"
    unused = sorted(set(test_only) - set(used))
    assert not unused, (f"tests/requirements.yml declares {unused}, which nothing under "
                        f"{', '.join(path.name for path in TEST_ONLY)} uses")


TASKS = """
- name: A module
  community.crypto.openssl_privatekey:
    path: /k
  when: x is community.general.a_test
- name: A filter and a lookup
  ansible.builtin.debug:
    msg: "{{ x | community.general.dict_kv('k') }} {{ lookup('community.general.a_lookup', 'y') }}
      {{ y | map('other.filters.by_name', 1) | selectattr('k', 'other.tests.by_name')
         | selectattr('an.attribute.path', 'defined') }}"
  environment:
    ANSIBLE_STDOUT_CALLBACK: ansible.posix.json
- name: Settings of sysctl, not a task
  ansible.builtin.set_fact:
    sysctl:
      - net.ipv4.ip_forward: 1
- name: Built in and own
  llamacpp.rpc_cluster.llama_warn:
    msg: "{{ x | ansible.builtin.to_json }}"
- name: A role
  ansible.builtin.include_role:
    name: other.roles.server
"""


def test_the_scan_finds_each_kind_of_use(tmp_path):
    path = tmp_path / "tasks.yml"
    path.write_text(TASKS)
    assert uses_in_file(path) == {
        "community.crypto.openssl_privatekey", "community.general.a_test", "community.general.dict_kv",
        "community.general.a_lookup", "ansible.posix.json", "ansible.builtin.debug", "ansible.builtin.set_fact",
        "llamacpp.rpc_cluster.llama_warn", "ansible.builtin.to_json", "ansible.builtin.include_role",
        "other.roles.server", "other.filters.by_name", "other.tests.by_name"}


@pytest.mark.parametrize("text, expected", [
    ('{"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks, community.general.x"}',
     {"ansible.posix.profile_tasks", "community.general.x"}),
    ("    ansible_connection: community.docker.docker", {"community.docker.docker"}),
    ("from ansible_collections.community.crypto.plugins.module_utils import x", {"community.crypto._"}),
    ("import ansible.module_utils.basic", set()),
    ("{{ name | replace('.', '_') }} llama.cpp.tar", set()),
])
def test_the_scan_reads_text(tmp_path, text, expected):
    path = tmp_path / "sample.py"
    path.write_text(text)
    assert uses_in_file(path) == expected
