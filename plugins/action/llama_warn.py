"""Action plugin llama_warn: one warning, shown by Ansible as such, on the controller."""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    """See plugins/modules/llama_warn.py for the documentation."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        message = str(self._task.args.get("msg") or "")
        if not message:
            return dict(result, failed=True, msg="llama_warn: msg is required")
        result["warnings"] = result.get("warnings", []) + [message]
        return dict(result, changed=False, msg=message)
