"""ansible-lint rules of this project's conventions (.ansible-lint: rulesdir), run by `make lint`:

llama-assert-quiet     an ansible.builtin.assert without `quiet: true` among its arguments: its failure is then
                       printed over many lines with the assertion, and the message users read (and tests match) is
                       lost among them. Misplaced under `vars:`, it is not an argument either.
llama-api-key-no-log   a task whose module arguments hold the API key's value (a file's content, a request's header)
                       without `no_log`: `-v` would print the key, and its result reaches every callback.
                       `llama_api_key | length` (whether there is a key) is not its value.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ansiblelint.rules import AnsibleLintRule
from ansiblelint.utils import convert_to_boolean

if TYPE_CHECKING:
    from ansiblelint.file_utils import Lintable
    from ansiblelint.utils import Task

API_KEY_VALUE = re.compile(r"\bllama_api_key\b(?!\s*\|\s*length)")


def arguments(task):
    """The module's arguments of `task`, without ansible-lint's own keys."""
    return {key: value for key, value in task["action"].items() if not key.startswith("__")}


class AssertQuietRule(AnsibleLintRule):
    """Asserts fail with their message only (quiet: true)."""

    id = "llama-assert-quiet"
    description = "An ansible.builtin.assert needs `quiet: true` among its arguments, so that its failure is its message."
    severity = "MEDIUM"
    tags = ["llamacpp-rpc-cluster"]
    version_changed = "1.1.0"

    def matchtask(self, task: Task, file: Lintable | None = None) -> bool | str:
        if task["action"]["__ansible_module__"] not in ("ansible.builtin.assert", "assert"):
            return False
        if convert_to_boolean(arguments(task).get("quiet", False)):
            return False
        return "assert without quiet: true: its failure would bury its message"


class ApiKeyNoLogRule(AnsibleLintRule):
    """Tasks that hold the API key's value do not log."""

    id = "llama-api-key-no-log"
    description = "A task whose module arguments hold llama_api_key's value needs `no_log: true`."
    severity = "HIGH"
    tags = ["llamacpp-rpc-cluster", "security"]
    version_changed = "1.1.0"

    def matchtask(self, task: Task, file: Lintable | None = None) -> bool | str:
        if not API_KEY_VALUE.search(str(arguments(task))):
            return False
        no_log = task.get("no_log", False)
        if isinstance(no_log, str) and no_log.strip().startswith("{{"):
            return False  # decided at run time
        if convert_to_boolean(no_log):
            return False
        return "holds llama_api_key's value without no_log: true: -v would print the key"
