"""Every role's contract: specs and README present, one owner per variable, defaults == specs, declared
inputs, README tables generated from the specs. Then unit tests of tools/role_docs.py on a fake role.

Roles are discovered under roles/*/, never named here: the checks follow renames and splits.
"""

from __future__ import annotations

import importlib
import re
import copy
import difflib
import functools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from conftest import ROOT, load

TOOL = ROOT / "tools" / "role_docs.py"
role_docs = load("role_docs", TOOL)
# The ownership rule is the one preflight applies (plugins/action/llama_validate_vars.py).
owner_of = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.action.llama_validate_vars").owner

ROLES = [role.name for role in role_docs.find_roles(ROOT)]
SET_FACT = {"ansible.builtin.set_fact", "ansible.legacy.set_fact", "set_fact"}
SET_FACT_ARGS = {"cacheable"}

by_role = pytest.mark.parametrize("role", ROLES)


# --- helpers ----------------------------------------------------------------------------------------


def role_dir(role: str) -> Path:
    return ROOT / "roles" / role


def defaults_of(role: str) -> dict:
    try:
        return role_docs.role_defaults(role_dir(role))
    except role_docs.RoleDocsError as exc:
        pytest.fail(f"cannot check role {role}: {exc}", pytrace=False)


def entry_points_of(role: str) -> dict:
    try:
        return role_docs.role_entry_points(role_dir(role))
    except role_docs.RoleDocsError as exc:
        pytest.fail(f"cannot check role {role}: {exc}", pytrace=False)


@functools.lru_cache(maxsize=None)
def all_defaults() -> dict[str, dict]:
    """Every role's defaults; a role whose defaults cannot be read counts as none (its own tests say why)."""
    found = {}
    for role in ROLES:
        try:
            found[role] = role_docs.role_defaults(role_dir(role))
        except role_docs.RoleDocsError:
            found[role] = {}
    return found


def owner(variable: str, roles: list[str] = ROLES) -> str | None:
    """The role a public variable belongs to: the longest role name that prefixes it as `<role>_`."""
    return owner_of(variable, roles)


def _set_fact_keys(node, found: set[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _set_fact_keys(item, found)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in SET_FACT:
                if isinstance(value, dict):
                    found.update(k for k in value if k not in SET_FACT_ARGS)
                elif isinstance(value, str):  # free form: set_fact: a=1 b=2
                    found.update(word.split("=", 1)[0] for word in value.split() if "=" in word)
            else:
                _set_fact_keys(value, found)


@functools.lru_cache(maxsize=None)
def published_facts() -> frozenset[str]:
    """Public facts some task sets: set_fact keys in role tasks and handlers and in playbooks."""
    files = [*ROOT.glob("roles/*/tasks/**/*.yml"), *ROOT.glob("roles/*/handlers/*.yml"),
             *ROOT.glob("playbooks/**/*.yml")]
    found: set[str] = set()
    for path in files:
        try:
            _set_fact_keys(role_docs.load_yaml(path), found)
        except role_docs.RoleDocsError:
            continue  # yamllint reports broken YAML; an unreadable file publishes nothing here
    return frozenset(name for name in found if not name.startswith("__"))


def same_value(a, b) -> bool:
    """Deep equality that also compares types, so `true` != `1` and `1` != `1.0`."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


def shown(value) -> str:
    """A value with its YAML type, e.g. `2 (int)` next to `"2" (str)`."""
    return f"{role_docs.format_default(value)} ({type(value).__name__})"


def is_templated(value) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(is_templated(k) or is_templated(v) for k, v in value.items())
    if isinstance(value, list):
        return any(is_templated(v) for v in value)
    return False


def expect_none(problems: list[str], role: str, what: str) -> None:
    """Fail with every problem listed, one a line, and no traceback: the list is the whole story."""
    if problems:
        pytest.fail(f"role {role}: {what}:\n  " + "\n  ".join(problems), pytrace=False)


# --- 1. files ---------------------------------------------------------------------------------------


def test_roles_are_found():
    assert ROLES, f"no role directories under {ROOT / 'roles'}"


@by_role
def test_role_has_specs_and_readme(role):
    missing = [f"roles/{role}/{name}" for name in ("meta/argument_specs.yml", "README.md")
               if not (role_dir(role) / name).is_file()]
    expect_none(missing, role, "missing files")


# --- 2. one owner per variable ----------------------------------------------------------------------


@by_role
def test_defaults_have_one_owner(role):
    problems = []
    for name in defaults_of(role):
        if name.startswith("__"):
            problems.append(f"{name}: internal (`__{role}_*`) names belong in vars/ or tasks, not in defaults")
            continue
        also = [other for other, defaults in all_defaults().items() if other != role and name in defaults]
        if also:
            problems.append(f"{name}: also a default of role(s) {', '.join(also)}; keep it in one owner")
        belongs = owner(name)
        if belongs is None:
            problems.append(f"{name}: lacks the role's prefix `{role}_`")
        elif belongs != role:
            problems.append(f"{name}: by the longest-prefix rule it belongs to role {belongs}; "
                            f"move it there or rename it `{role}_...`")
    expect_none(problems, role, "defaults/main.yml variables without a single, prefixed owner")


# --- 3. defaults == specs ---------------------------------------------------------------------------


@by_role
def test_defaults_are_main_options_with_equal_default(role):
    main = entry_points_of(role).get("main", {}).get("options", {})
    problems = []
    for name, value in defaults_of(role).items():
        if name not in main:
            problems.append(f"{name}: not an option of the `main` entry point")
        elif "default" not in main[name]:
            problems.append(f"{name}: the `main` option has no `default` (defaults/main.yml: {shown(value)})")
        elif not same_value(main[name]["default"], value):
            problems.append(f"{name}: spec default {shown(main[name]['default'])} "
                            f"!= defaults/main.yml {shown(value)}")
    expect_none(problems, role, "defaults/main.yml disagrees with meta/argument_specs.yml")


@by_role
def test_spec_defaults_are_role_defaults(role):
    defaults = defaults_of(role)
    problems = []
    for entry_point, spec in entry_points_of(role).items():
        for name, option in spec["options"].items():
            if "default" not in option:
                continue
            if name not in defaults:
                problems.append(f"{entry_point}.{name}: has `default: {role_docs.format_default(option['default'])}`"
                                " but is not a key of defaults/main.yml (a default lives in its owner's defaults)")
            elif not same_value(option["default"], defaults[name]):
                problems.append(f"{entry_point}.{name}: spec default {shown(option['default'])} "
                                f"!= defaults/main.yml {shown(defaults[name])}")
    expect_none(problems, role, "spec defaults that defaults/main.yml does not hold")


@by_role
def test_options_without_default_are_required(role):
    defaults = defaults_of(role)
    problems = []
    for entry_point, spec in entry_points_of(role).items():
        for name, option in spec["options"].items():
            has_default, required = "default" in option, bool(option.get("required"))
            if has_default and required:
                problems.append(f"{entry_point}.{name}: both `default` and `required: true`")
            elif not has_default and not required and name not in defaults:
                if option.get("required") is False and name in published_facts():
                    continue  # a fact only some hosts have (e.g. the master's), declared `required: false`
                problems.append(f"{entry_point}.{name}: neither `default` nor `required: true`")
    expect_none(problems, role, "options that are neither defaulted nor required")


@by_role
def test_defaults_validate_against_main_spec(role):
    main = entry_points_of(role).get("main", {}).get("options", {})
    defaults = {name: value for name, value in defaults_of(role).items()
                if name in main and not is_templated(value)}  # templated ones: test_defaults_are_plain_data
    spec = {name: copy.deepcopy(main[name]) for name in defaults}
    result = ArgumentSpecValidator(spec).validate(copy.deepcopy(defaults))
    expect_none(result.error_messages, role, "defaults/main.yml fails its own `main` spec")


@by_role
def test_defaults_are_plain_data(role):
    problems = [f"{name}: {role_docs.format_default(value)}"
                for name, value in defaults_of(role).items() if is_templated(value)]
    expect_none(problems, role, "templated defaults (compute derived values in tasks, keep defaults data)")


# --- 4. inputs come from a declared source ----------------------------------------------------------


@by_role
def test_inputs_have_a_declared_source(role):
    own = defaults_of(role)
    others = {name for other, defaults in all_defaults().items() if other != role for name in defaults}
    facts = published_facts()
    # What the inventory must give another role, which declares it `required: true` (llamacpp_commit).
    inventory = {name for other in ROLES if other != role for spec in entry_points_of(other).values()
                 for name, option in spec["options"].items() if option.get("required") and owner(name) == other}
    problems = []
    for entry_point, spec in entry_points_of(role).items():
        for name, option in spec["options"].items():
            if name in own or name in others or name in facts or name in inventory:
                continue
            if owner(name) == role and option.get("required"):
                continue  # an entry-point parameter of this role, passed by its caller
            hint = ("make it `required: true` or give it a default" if owner(name) == role
                    else "not another role's default, not a fact any set_fact publishes, "
                         f"not a `{role}_` parameter")
            problems.append(f"{entry_point}.{name}: {hint}")
    expect_none(problems, role, "options read from nowhere")


# --- 5. README tables == specs ----------------------------------------------------------------------


@by_role
def test_readme_tables_match_specs(role):
    readme = role_dir(role) / "README.md"
    if not readme.is_file():
        pytest.fail(f"roles/{role}/README.md missing; run tools/role_docs.py --write {role}", pytrace=False)
    try:
        wanted = role_docs.render(role_dir(role))
        current = role_docs.readme_block(readme.read_text(encoding="utf-8"))
    except role_docs.RoleDocsError as exc:
        pytest.fail(f"roles/{role}/README.md: {exc}", pytrace=False)
    if current is None:
        pytest.fail(f"roles/{role}/README.md has no generated block; run tools/role_docs.py --write {role}",
                    pytrace=False)
    diff = "".join(difflib.unified_diff(current.splitlines(keepends=True), wanted.splitlines(keepends=True),
                                        "README.md", "generated"))
    if current != wanted:
        pytest.fail(f"roles/{role}/README.md is out of date; run tools/role_docs.py --write {role}\n{diff}",
                    pytrace=False)


# --- 6. tools/role_docs.py --------------------------------------------------------------------------

DEMO_DEFAULTS = """\
---
demo_port: 50052
demo_name: ""
demo_pools: [2.debian.pool.ntp.org]
demo_mode: memory
demo_stratum: null
demo_enabled: true
"""

DEMO_SPECS = """\
---
argument_specs:
  main:
    short_description: Run the demo service
    options:
      demo_port:
        type: int
        default: 50052
        description: Port to listen on.
      demo_name:
        type: str
        default: ""
        description:
          - Name the API reports;
          - empty = the host name.
      demo_pools:
        type: list
        elements: str
        default: [2.debian.pool.ntp.org]
        description: >-
          NTP pools (a | b).
      demo_mode:
        type: str
        default: memory
        choices: [memory, speed]
        description: How to plan.
      demo_stratum:
        type: int
        default: null
        description: Stratum; null = none.
      demo_enabled:
        type: bool
        default: true
        description: Run it.
      other_user:
        type: str
        required: true
        description: Service user (from other).
  facts:
    short_description: Publish demo_node
    options:
      other_user:
        type: str
        description: Service user, again.
      other_node:
        type: dict
        required: true
        description: Fact from other's main.
      demo_timeout:
        type: int
        required: true
        description: Seconds to wait.
"""

DEMO_BLOCK = """\
| Variable | Default | Meaning |
|---|---|---|
| `demo_port` | `50052` | Port to listen on. |
| `demo_name` | `""` | Name the API reports; empty = the host name. |
| `demo_pools` | `["2.debian.pool.ntp.org"]` | NTP pools (a \\| b). |
| `demo_mode` | `memory` | How to plan. |
| `demo_stratum` | `null` | Stratum; null = none. |
| `demo_enabled` | `true` | Run it. |

### Inputs

| Variable | Entry points | Required | Meaning |
|---|---|---|---|
| `other_user` | main, facts | yes (main) | Service user (from other). |
| `other_node` | facts | yes | Fact from other's main. |
| `demo_timeout` | facts | yes | Seconds to wait. |

### Entry points

- `main`: Run the demo service
- `facts` (`tasks_from: facts`): Publish demo_node
"""

README_BEFORE = "# demo\n\nIntro.\n\n## Role Variables\nHand-written prose.\n\n## Dependencies\nNone.\n"


def make_role(root: Path, name: str = "demo", defaults: str | None = DEMO_DEFAULTS, specs: str | None = DEMO_SPECS,
              readme: str | None = README_BEFORE) -> Path:
    role = root / "roles" / name
    (role / "meta").mkdir(parents=True)
    if defaults is not None:
        (role / "defaults").mkdir()
        (role / "defaults" / "main.yml").write_text(defaults)
    if specs is not None:
        (role / "meta" / "argument_specs.yml").write_text(specs)
    if readme is not None:
        (role / "README.md").write_text(readme)
    return role


def wrapped(block: str) -> str:
    return f"{role_docs.BEGIN}\n{block}{role_docs.END}\n"


def run_tool(root: Path, *args: str) -> int:
    return role_docs.main(["--root", str(root), *args])


def test_render_variables_inputs_and_entry_points(tmp_path):
    assert role_docs.render(make_role(tmp_path)) == DEMO_BLOCK


def test_render_role_without_defaults(tmp_path):
    specs = "argument_specs:\n  main:\n    short_description: Tasks only\n"
    role = make_role(tmp_path, defaults=None, specs=specs)
    assert role_docs.render(role) == f"{role_docs.NO_VARIABLES}\n\n### Entry points\n\n- `main`: Tasks only\n"


def test_render_without_specs_names_the_file(tmp_path):
    with pytest.raises(role_docs.RoleDocsError, match=r"demo/meta/argument_specs\.yml: missing"):
        role_docs.render(make_role(tmp_path, specs=None))


@pytest.mark.parametrize(("value", "text"), [
    (50052, "50052"), ("", '""'), ([], "[]"), ("memory", "memory"), (None, "null"), (True, "true"),
    (["2.debian.pool.ntp.org"], '["2.debian.pool.ntp.org"]'), (0.15, "0.15"), (1.0, "1.0"), ("true", '"true"'),
    ("8080", '"8080"'), ("/opt/llama.cpp", "/opt/llama.cpp"), ({"a": 1}, '{"a": 1}'), ("{{ x }}", '"{{ x }}"'),
])
def test_format_default(value, text):
    assert role_docs.format_default(value) == text


def test_readme_block():
    assert role_docs.readme_block(README_BEFORE) is None
    assert role_docs.readme_block("# x\n\n" + wrapped("a\n\nb\n") + "after\n") == "a\n\nb\n"
    with pytest.raises(role_docs.RoleDocsError, match="one BEGIN marker"):
        role_docs.readme_block(f"{role_docs.BEGIN}\nno end\n")


def test_write_inserts_after_role_variables_heading(tmp_path):
    role = make_role(tmp_path)
    assert run_tool(tmp_path, "--write") == 0
    assert (role / "README.md").read_text() == (
        "# demo\n\nIntro.\n\n## Role Variables\n\n" + wrapped(DEMO_BLOCK)
        + "\nHand-written prose.\n\n## Dependencies\nNone.\n")


def test_write_appends_a_section_without_heading(tmp_path):
    role = make_role(tmp_path, readme="# demo\n\nIntro.")
    assert run_tool(tmp_path, "--write") == 0
    assert (role / "README.md").read_text() == "# demo\n\nIntro.\n\n## Role Variables\n\n" + wrapped(DEMO_BLOCK)


def test_write_creates_a_missing_readme(tmp_path):
    role = make_role(tmp_path, readme=None)
    assert run_tool(tmp_path, "--write") == 0
    assert role_docs.readme_block((role / "README.md").read_text()) == DEMO_BLOCK


def test_write_replaces_a_stale_block_only(tmp_path):
    before, after = "# demo\n\n## Role Variables\n\n", "\nKept | as is.\n"
    role = make_role(tmp_path, readme=before + wrapped("| `gone` | `1` | Old. |\n") + after)
    assert run_tool(tmp_path, "--write") == 0
    assert (role / "README.md").read_text() == before + wrapped(DEMO_BLOCK) + after


def test_write_is_idempotent_and_check_agrees(tmp_path, capsys):
    role = make_role(tmp_path)
    assert run_tool(tmp_path, "--write") == 0
    written = (role / "README.md").read_text()
    capsys.readouterr()
    assert run_tool(tmp_path, "--write") == 0
    assert capsys.readouterr().out == ""
    assert (role / "README.md").read_text() == written
    assert run_tool(tmp_path, "--check") == 0


def test_check_reports_stale_readmes_with_a_diff(tmp_path, capsys):
    role = make_role(tmp_path)
    assert run_tool(tmp_path, "--check") == 1
    out, err = capsys.readouterr()
    assert "+| `demo_port` | `50052` | Port to listen on. |" in out
    assert "--- roles/demo/README.md (current)" in out
    assert "roles/demo/README.md" in err and "--write" in err
    assert (role / "README.md").read_text() == README_BEFORE


def test_role_arguments_restrict_the_run(tmp_path):
    make_role(tmp_path, "demo")
    make_role(tmp_path, "demo_other")
    assert run_tool(tmp_path, "--write", "demo") == 0
    assert run_tool(tmp_path, "--check", "demo") == 0
    assert run_tool(tmp_path, "--check", "demo_other") == 1
    assert run_tool(tmp_path, "--check") == 1


def test_unknown_role_and_unreadable_role_exit_2(tmp_path, capsys):
    make_role(tmp_path, "demo", specs=None)
    assert run_tool(tmp_path, "--check", "nosuch") == 2
    assert "no such role" in capsys.readouterr().err
    assert run_tool(tmp_path, "--write") == 2
    assert "meta/argument_specs.yml: missing" in capsys.readouterr().err


def test_command_line(tmp_path):
    make_role(tmp_path)

    def cli(*args):
        return subprocess.run([sys.executable, str(TOOL), "--root", str(tmp_path), *args],
                              capture_output=True, text=True, check=False)

    assert cli("--check").returncode == 1
    assert cli("--write").returncode == 0
    assert cli("--check").returncode == 0
    assert cli().returncode == 2  # --check or --write is required


def test_owner_takes_the_longest_prefix():
    roles = ["llama", "llama_server", "llamacpp"]
    assert owner("llama_server_port", roles) == "llama_server"
    assert owner("llama_split_strategy", roles) == "llama"
    assert owner("llamacpp_commit", roles) == "llamacpp"
    assert owner("chrony_servers", roles) is None


def test_set_fact_keys_are_found_in_blocks_and_free_form():
    tasks = textwrap.dedent("""\
        - name: A block
          block:
            - ansible.builtin.set_fact:
                demo_fact: 1
                cacheable: true
          rescue:
            - set_fact: other_fact=2 __private=3
        - ansible.builtin.debug:
            msg: hi
        """)
    found: set[str] = set()
    _set_fact_keys(yaml.safe_load(tasks), found)
    assert found == {"demo_fact", "other_fact", "__private"}


def test_every_entry_point_used_is_declared():
    """Every `tasks_from` of a project role, in the roles, playbooks and scenarios, names an entry point that the
    role's argument_specs declares (a tasks file reached from outside the role is a contract)."""
    used = re.compile(r"name:\s*(?:llamacpp\.rpc_cluster\.)?(\w+)\s*\n\s*tasks_from:\s*(\w+)")
    undeclared = set()
    for path in [*ROOT.glob("*.yml"), *ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/**/*.yml"),
                 *ROOT.glob("molecule/**/*.yml")]:
        for role, entry in used.findall(path.read_text()):
            spec = ROOT / "roles" / role / "meta" / "argument_specs.yml"
            if spec.is_file() and entry not in yaml.safe_load(spec.read_text())["argument_specs"]:
                undeclared.add(f"{path.relative_to(ROOT)}: {role} entry point {entry}")
    assert not undeclared, sorted(undeclared)
