"""Action plugin llama_deprecated: a deprecation warning for a name the collection replaced, on the controller."""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    """See library/llama_deprecated.py for the documentation."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        old, new, removed_in = args.get("old"), args.get("new"), args.get("removed_in")
        if not (old and new and removed_in):
            return dict(result, failed=True, msg="llama_deprecated: old, new and removed_in are required")
        message = (f"{old} is deprecated and works until {removed_in}: it is {new} now. Use that name "
                   f"instead.")
        result["warnings"] = result.get("warnings", []) + [message]
        return dict(result, changed=False, msg=message)
