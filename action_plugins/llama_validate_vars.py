"""Action plugin llama_validate_vars: check a host's variables against the roles' argument_specs, on the controller."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import yaml
from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.errors import ArgumentTypeError, ArgumentValueError, ElementError, RequiredError
from ansible.plugins.action import ActionBase

_NAMED = re.compile(r"(?:argument|option) '([^']+)'|value of (\S+) must")
_ARTICLE = {"int": "an int", "float": "a number", "bool": "a boolean", "str": "a string", "list": "a list",
            "dict": "a dict", "path": "a path", "raw": "a value"}


def find_roles(search_paths):
    """{role name: role directory} of every role (a directory with meta/argument_specs.yml) on the paths."""
    roles = {}
    for base in search_paths:
        for spec in sorted(Path(base).glob("*/meta/argument_specs.yml")):
            roles.setdefault(spec.parents[1].name, spec.parents[1])
    return roles


def load_specs(role_dir):
    """The entry points of a role's meta/argument_specs.yml."""
    return yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def load_renamed(role_dir):
    """{old name: {name: the new name, removed_in: the release}} of a role's meta/renamed.yml ({} without one)."""
    path = role_dir / "meta" / "renamed.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def renamed_in_use(host, role_dirs, values):
    """(warnings, errors) for the variables set under a name their role replaced: the old name still works, with a
    warning that names the new one; both names set at once is an error."""
    warnings, errors = [], []
    for role_dir in role_dirs.values():
        for old, new in sorted(load_renamed(role_dir).items()):
            if old not in values:
                continue
            if new["name"] in values:
                errors.append(f"{host}: both {old} and {new['name']} are set: {old} is the name {new['name']} had "
                              f"before. Remove {old} from the inventory.")
            else:
                warnings.append(f"{host}: {old} is deprecated and works until {new['removed_in']}: rename it "
                                f"{new['name']} in the inventory.")
    return warnings, errors


def owner(name, roles):
    """The role a variable belongs to: the longest role name that prefixes it (llama_server_port: llama_server)."""
    return max((role for role in roles if name.startswith(f"{role}_")), key=len, default=None)


def describe(error, options, values):
    """One validation error as a sentence naming the variable, what it must be and what it is."""
    if isinstance(error, RequiredError):
        names = error.msg.split(": ", 1)[-1]
        return names.split(", ")[0], f"{names} must be set"
    match = _NAMED.search(error.msg)
    name = next((group for group in match.groups() if group), None) if match else None
    if name not in options:
        return name, error.msg
    option, value = options[name], values.get(name)
    if option.get("no_log"):
        value = "********"
    if isinstance(error, ElementError):
        return name, f"{name} must be a list of {option.get('elements')} items, got {value!r}"
    if isinstance(error, ArgumentTypeError):
        return name, f"{name} must be {_ARTICLE.get(option.get('type'), option.get('type'))}, got {value!r}"
    if isinstance(error, ArgumentValueError):
        return name, error.msg.replace(f"value of {name} must", f"{name} must", 1)
    return name, error.msg


def _one_line(description):
    text = " ".join(description) if isinstance(description, list) else str(description or "")
    return " ".join(text.split())


def validate(host, roles, role_dirs, values, ignore=()):
    """Messages for `values` (the host's variables) against `roles`' own options, and for unknown names.

    A role's own options are those of its main entry point that carry its prefix (the others are inputs:
    facts, other roles' variables). Values are validated as given; defaults are checked by the unit tests.
    """
    specs = {role: load_specs(role_dir) for role, role_dir in role_dirs.items()}
    known = set(ignore) | {name for entries in specs.values() for entry in entries.values()
                           for name in (entry.get("options") or {})} \
        | {old for role_dir in role_dirs.values() for old in load_renamed(role_dir)}
    messages = []
    for role in roles:
        if role not in specs:
            raise ValueError(f"llama_validate_vars: no role {role!r} (found {', '.join(sorted(specs))})")
        options = (specs[role].get("main") or {}).get("options") or {}
        spec = {name: {key: value for key, value in option.items() if key not in ("default", "description")}
                for name, option in options.items() if owner(name, specs) == role}
        present = {name: values[name] for name in spec if name in values}
        for error in ArgumentSpecValidator(spec).validate(present).errors:
            name, problem = describe(error, options, present)
            what = f" {name}: {_one_line(options[name].get('description'))}" if name in options else ""
            messages.append(f"{host}: {problem}.{what} Fix it in the inventory (roles/{role}/README.md).")
    for name in sorted(values):
        if owner(name, specs) and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            messages.append(f"{host}: {name} is not a variable of any role{hint}. Fix or remove it in the inventory.")
    return messages


class ActionModule(ActionBase):
    """See library/llama_validate_vars.py for the documentation."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        roles = list(args.get("roles") or [])
        ignore = list(args.get("ignore") or [])
        base = Path(self._loader.get_basedir())
        paths = [Path(path) for path in C.DEFAULT_ROLES_PATH] + [base / "roles", base.parent / "roles"]
        role_dirs = find_roles([path for path in paths if path.is_dir()])
        host = task_vars.get("inventory_hostname", "?")
        names = [name for name in task_vars if owner(name, role_dirs)]
        values, messages = {}, []
        for name in names:
            try:
                values[name] = self._templar.template(task_vars[name])
            except AnsibleError as err:
                messages.append(f"{host}: {name} cannot be evaluated ({err.message}). Fix it in the inventory.")
        try:
            messages += validate(host, roles, role_dirs, values, ignore)
        except ValueError as err:
            return dict(result, failed=True, msg=str(err))
        warnings, errors = renamed_in_use(host, role_dirs, values)
        messages += errors
        if warnings:
            result["warnings"] = result.get("warnings", []) + warnings
        if messages:
            return dict(result, failed=True, msg=" ".join(messages), errors=messages)
        return dict(result, changed=False, msg=f"{host}: the variables of {', '.join(roles)} are valid")
