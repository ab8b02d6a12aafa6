#!/usr/bin/env python3
"""Generate the variable tables of each role's README from its meta/argument_specs.yml.

The generated block sits between two marker lines in roles/<role>/README.md; text outside the markers
is never touched:

    <!-- BEGIN role_docs: generated from meta/argument_specs.yml by tools/role_docs.py -->
    ...
    <!-- END role_docs -->

It holds the role's own variables (the `main` entry point's options that are keys of
defaults/main.yml, with their defaults), the inputs it reads without owning them (options that are
not its defaults: other roles' variables, facts, entry-point parameters), and its entry points.

    tools/role_docs.py --check [ROLE...]   exit 1 and print a diff when a README is out of date
    tools/role_docs.py --write [ROLE...]   rewrite the generated blocks

Roles are the directories under roles/; without ROLE arguments every role is processed. A README
without markers gets the block right after its `## Role Variables` heading, or in a new
`## Role Variables` section at its end. Exit status 2: a role or README the tool cannot process.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

BEGIN = "<!-- BEGIN role_docs: generated from meta/argument_specs.yml by tools/role_docs.py -->"
END = "<!-- END role_docs -->"
ROOT = Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^##\s+Role Variables\s*$")
NO_VARIABLES = "This role has no variables of its own."


class RoleDocsError(Exception):
    """A role or README this tool cannot process; the message names the file and the fix."""


class _TolerantLoader(yaml.SafeLoader):
    """SafeLoader that reads Ansible's tagged values (`!unsafe`, `!vault`) as their plain value."""


def _untagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


_TolerantLoader.add_multi_constructor("!", _untagged)


def load_yaml(path: Path) -> Any:
    """The YAML document in `path`, or None when the file does not exist or is empty."""
    if not path.is_file():
        return None
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_TolerantLoader)
    except yaml.YAMLError as exc:
        raise RoleDocsError(f"{path}: not valid YAML: {exc}") from exc


def find_roles(root: Path) -> list[Path]:
    """Every role directory under root/roles, sorted by name."""
    roles = root / "roles"
    if not roles.is_dir():
        return []
    return sorted(p for p in roles.iterdir()
                  if p.is_dir() and not p.name.startswith("."))


def role_defaults(role_dir: Path) -> dict[str, Any]:
    """The mapping in defaults/main.yml ({} when there is none)."""
    path = role_dir / "defaults" / "main.yml"
    data = load_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RoleDocsError(f"{path}: expected a mapping of variables, got {type(data).__name__}")
    return data


def role_entry_points(role_dir: Path) -> dict[str, dict[str, Any]]:
    """meta/argument_specs.yml's entry points, in file order, each with an `options` mapping."""
    path = role_dir / "meta" / "argument_specs.yml"
    data = load_yaml(path)
    if data is None:
        raise RoleDocsError(f"{path}: missing or empty; every role declares its entry points there")
    specs = data.get("argument_specs") if isinstance(data, dict) else None
    if not isinstance(specs, dict):
        raise RoleDocsError(f"{path}: expected a top-level `argument_specs:` mapping of entry points")
    entry_points = {}
    for name, spec in specs.items():
        spec = spec or {}
        options = (spec.get("options") if isinstance(spec, dict) else None) or {}
        if not isinstance(spec, dict) or not isinstance(options, dict):
            raise RoleDocsError(f"{path}: entry point {name!r}: expected a mapping with an `options` mapping")
        entry_points[name] = {**spec, "options": {k: v or {} for k, v in options.items()}}
    return entry_points


def one_line(text: Any) -> str:
    """A description (string or list of strings) as one line of text."""
    if text is None:
        return ""
    if isinstance(text, list):
        text = " ".join(str(part) for part in text)
    return " ".join(str(text).split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def format_default(value: Any) -> str:
    """A default in compact flow form: `50052`, `""`, `[]`, `memory`, `null`, `["a", "b"]`."""
    if isinstance(value, str) and value and value == value.strip():
        try:
            reads_back = yaml.safe_load(value)
        except yaml.YAMLError:
            reads_back = None
        if reads_back == value and "\n" not in value:
            return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _required_cell(required_in: list[str], entry_points: list[str]) -> str:
    if not required_in:
        return "no"
    if required_in == entry_points:
        return "yes"
    return "yes (" + ", ".join(required_in) + ")"


def render(role_dir: Path) -> str:
    """The generated block of role_dir's README: the text between the marker lines."""
    role_dir = Path(role_dir)
    defaults = role_defaults(role_dir)
    entry_points = role_entry_points(role_dir)
    main_options = entry_points.get("main", {}).get("options", {})

    own = [name for name in main_options if name in defaults]
    if own:
        rows = [
            [f"`{name}`", f"`{format_default(defaults[name])}`", one_line(main_options[name].get("description"))]
            for name in own
        ]
        lines = _table(["Variable", "Default", "Meaning"], rows)
    else:
        lines = [NO_VARIABLES]

    inputs: dict[str, dict[str, Any]] = {}
    for ep_name, spec in entry_points.items():
        for name, option in spec["options"].items():
            if name in defaults:
                continue
            seen = inputs.setdefault(name, {"in": [], "required": [], "description": None})
            seen["in"].append(ep_name)
            if option.get("required"):
                seen["required"].append(ep_name)
            if seen["description"] is None and option.get("description"):
                seen["description"] = option["description"]
    if inputs:
        rows = [
            [f"`{name}`", ", ".join(seen["in"]), _required_cell(seen["required"], seen["in"]),
             one_line(seen["description"])]
            for name, seen in inputs.items()
        ]
        lines += ["", "### Inputs", ""] + _table(["Variable", "Entry points", "Required", "Meaning"], rows)

    lines += ["", "### Entry points", ""]
    for ep_name, spec in entry_points.items():
        label = f"`{ep_name}`" if ep_name == "main" else f"`{ep_name}` (`tasks_from: {ep_name}`)"
        summary = one_line(spec.get("short_description"))
        lines.append(f"- {label}: {summary}" if summary else f"- {label}")
    return "\n".join(lines) + "\n"


def _marker_lines(lines: list[str]) -> tuple[int, int] | None:
    begins = [i for i, line in enumerate(lines) if line.rstrip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.rstrip() == END]
    if not begins and not ends:
        return None
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise RoleDocsError(
            f"expected one BEGIN marker followed by one END marker, found {len(begins)} BEGIN and {len(ends)} END; "
            "fix the markers by hand (or delete both) and run tools/role_docs.py --write"
        )
    return begins[0], ends[0]


def readme_block(readme_text: str) -> str | None:
    """The text between the marker lines of a README, or None when it has no markers."""
    lines = readme_text.splitlines(keepends=True)
    markers = _marker_lines(lines)
    if markers is None:
        return None
    return "".join(lines[markers[0] + 1:markers[1]])


def updated_readme(readme_text: str, block: str, role_name: str) -> str:
    """readme_text with its generated block set to `block`; text outside the markers is kept as is."""
    wrapped = [BEGIN + "\n", block, END + "\n"]
    if not readme_text:
        return "".join([f"# {role_name}\n", "\n", "## Role Variables\n", "\n", *wrapped])
    lines = readme_text.splitlines(keepends=True)
    markers = _marker_lines(lines)
    if markers is not None:
        begin, end = markers
        return "".join(lines[:begin] + wrapped + lines[end + 1:])
    if not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    heading = next((i for i, line in enumerate(lines) if HEADING.match(line.rstrip("\n"))), None)
    if heading is None:
        separator = [] if lines[-1].strip() == "" else ["\n"]
        return "".join(lines + separator + ["## Role Variables\n", "\n", *wrapped])
    after = lines[heading + 1:]
    separator = [] if after and after[0].strip() == "" else ["\n"]
    return "".join(lines[:heading + 1] + ["\n", *wrapped] + separator + after)


def _select(root: Path, names: list[str]) -> list[Path]:
    roles = find_roles(root)
    if not names:
        return roles
    known = {role.name: role for role in roles}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise RoleDocsError(
            f"no such role under {root / 'roles'}: {', '.join(unknown)} (known: {', '.join(known) or 'none'})"
        )
    return [known[name] for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 and print a diff when a README is out of date")
    mode.add_argument("--write", action="store_true", help="rewrite the generated block of each README")
    parser.add_argument("--root", type=Path, default=ROOT, help="project root holding roles/ (default: %(default)s)")
    parser.add_argument("roles", nargs="*", metavar="ROLE", help="only these roles (default: every role)")
    args = parser.parse_args(argv)

    stale, errors = [], []
    try:
        roles = _select(args.root, args.roles)
    except RoleDocsError as exc:
        print(f"role_docs: {exc}", file=sys.stderr)
        return 2
    for role_dir in roles:
        readme = role_dir / "README.md"
        shown = readme.relative_to(args.root) if readme.is_relative_to(args.root) else readme
        current = readme.read_text(encoding="utf-8") if readme.is_file() else ""
        try:
            block = render(role_dir)
        except RoleDocsError as exc:
            errors.append(str(exc))
            continue
        try:
            wanted = updated_readme(current, block, role_dir.name)
        except RoleDocsError as exc:
            errors.append(f"{shown}: {exc}")
            continue
        if wanted == current:
            continue
        stale.append(str(shown))
        if args.write:
            readme.write_text(wanted, encoding="utf-8")
            print(f"wrote {shown}")
        else:
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(keepends=True), wanted.splitlines(keepends=True),
                fromfile=f"{shown} (current)", tofile=f"{shown} (generated)"))

    if args.check and stale:
        print(f"\n{len(stale)} README(s) out of date: {', '.join(stale)}\nrun tools/role_docs.py --write",
              file=sys.stderr)
    for error in errors:
        print(f"role_docs: {error}", file=sys.stderr)
    if errors:
        return 2
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
