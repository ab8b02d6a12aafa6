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


# What argument_specs cannot say: the range of each number. Every option named *_port is a TCP port; every other int
# or float option must have an entry here (tests/unit/test_action_plugins.py checks it): (lowest, highest, whether
# the lowest itself is refused), None where there is no bound.
PORT = (1, 65535, False)
AT_LEAST_1 = (1, None, False)
NOT_NEGATIVE = (0, None, False)
POSITIVE = (0, None, True)
RANGES = {
    "chrony_local_stratum": (1, 15, False),
    "chrony_makestep_threshold": NOT_NEGATIVE,
    "chrony_makestep_limit": (-1, None, False),  # chrony: a negative limit is no limit
    "llama_split_reserve_fraction": (0, 1, False),  # 1 itself: no memory left (the planner refuses it)
    "llama_calibrate_n_gen": AT_LEAST_1,
    "llama_calibrate_repetitions": AT_LEAST_1,
    "llama_calibrate_timeout": AT_LEAST_1,
    "llama_calibrate_health_timeout": AT_LEAST_1,
    "llama_front_hold_seconds": AT_LEAST_1,
    "llama_front_drain_seconds": NOT_NEGATIVE,
    "llama_front_retry_after": NOT_NEGATIVE,
    "llama_front_buffer_kib": (16, None, False),
    "llama_front_max_connections": AT_LEAST_1,
    "llama_front_timeout": AT_LEAST_1,
    "llama_link_seconds": (1, 60, False),
    "llama_link_min_gbits": NOT_NEGATIVE,
    "llama_link_max_rtt_ms": NOT_NEGATIVE,
    "llama_metrics_interval": AT_LEAST_1,
    "llama_monitor_scrape_interval": AT_LEAST_1,
    "llama_monitor_alert_after": AT_LEAST_1,
    "llama_monitor_max_clock_offset": POSITIVE,
    "llama_monitor_cache_warn_fraction": (0, 1, True),
    "llama_monitor_front_hold_alert_after": AT_LEAST_1,
    "llama_prefill_rate_mbit": POSITIVE,  # or ~: no cap
    "llama_prefill_threads": AT_LEAST_1,
    "llama_prefill_link_gbits": POSITIVE,
    "llama_rpc_threads": NOT_NEGATIVE,  # 0: llama.cpp's default
    "llama_rpc_cache_max_mib": NOT_NEGATIVE,  # 0: no cap
    "llama_rpc_ready_timeout": AT_LEAST_1,
    "llama_server_ctx_size": AT_LEAST_1,
    "llama_server_batch_size": AT_LEAST_1,
    "llama_server_ubatch_size": AT_LEAST_1,
    "llama_server_parallel": AT_LEAST_1,
    "llama_server_threads": NOT_NEGATIVE,  # 0: llama.cpp's default
    "llama_server_watch_interval": AT_LEAST_1,
    "llama_server_worker_wait_timeout": AT_LEAST_1,
    "llama_server_health_timeout": AT_LEAST_1,
    "llama_storage_keep": AT_LEAST_1,
    "llama_storage_chunk_mib": AT_LEAST_1,
    "llama_tls_ca_days": AT_LEAST_1,
    "llama_tls_cert_days": AT_LEAST_1,
    "llama_tls_renew_days": NOT_NEGATIVE,
    "llama_tls_ready_timeout": AT_LEAST_1,
    "llama_upgrade_rollback_timeout": AT_LEAST_1,
    "llama_upgrade_switch_delay": NOT_NEGATIVE,
    "llamacpp_build_number": NOT_NEGATIVE,
    "llamacpp_build_jobs": NOT_NEGATIVE,  # 0: one per core
    "llamacpp_keep_builds": AT_LEAST_1,  # the rollback point
}


def number_options(role_dirs):
    """{role: [its own number options]}: the int and float options of each role's main entry point without choices
    (those bound them already), and the raw ones that RANGES names (a number or ~)."""
    found = {}
    for role, role_dir in role_dirs.items():
        options = (load_specs(role_dir).get("main") or {}).get("options") or {}
        found[role] = sorted(name for name, option in options.items() if name.startswith(f"{role}_")
                             and "choices" not in option
                             and (option.get("type") in ("int", "float") or name in RANGES))
    return found


def bounds(name):
    """(lowest, highest, lowest refused) of a number option, or None."""
    return PORT if name.endswith("_port") else RANGES.get(name)


def out_of_range(name, value):
    """What is wrong with a number option's value, or None: `name must be ..., got value`."""
    rule = bounds(name)
    if rule is None or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # a raw option (a number or ~)
        return f"{name} must be a number or ~, got {value!r}"
    low, high, open_low = rule
    if (value > low if open_low else value >= low) and (high is None or value <= high):
        return None
    if rule == PORT:
        want = "a port number 1-65535"
    elif high is not None:
        want = f"in {'(' if open_low else '['}{low}, {high}]"
    elif open_low:
        want = f"more than {low}"
    else:
        want = "0 or more" if low == 0 else f"at least {low}"
    return f"{name} must be {want}, got {value!r}"


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
        checked = ArgumentSpecValidator(spec).validate(present)
        problems = [describe(error, options, present) for error in checked.errors]
        wrong = {problem[0] for problem in problems}
        problems += [(name, problem) for name, value in checked.validated_parameters.items()
                     if name in present and name not in wrong
                     for problem in [out_of_range(name, value)] if problem]
        for name, problem in problems:
            what = f" {name}: {_one_line(options[name].get('description'))}" if name in options else ""
            messages.append(f"{host}: {problem}.{what} Fix it in the inventory (roles/{role}/README.md).")
    for name in sorted(values):
        if owner(name, specs) and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            messages.append(f"{host}: {name} is not a variable of any role{hint}. Fix or remove it in the inventory.")
    return messages


class ActionModule(ActionBase):
    """See plugins/modules/llama_validate_vars.py for the documentation."""

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
