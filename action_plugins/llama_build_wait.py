"""Action plugin llama_build_wait: wait for a compilation started in the background, showing how far it is."""

from __future__ import annotations

import re
import shlex
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

_NINJA = re.compile(r"\[(\d+)/(\d+)\]")
_MAKE = re.compile(r"\[\s*(\d+)%\]")


def progress(text):
    """The last progress mark of a build tool's output: '123 of 456 steps' (ninja's [n/N]), '45%' (make's
    [ 45%]), or None before the first."""
    marks = [(match.start(), f"{match.group(1)} of {match.group(2)} steps") for match in _NINJA.finditer(text)]
    marks += [(match.start(), f"{match.group(1)}%") for match in _MAKE.finditer(text)]
    return max(marks)[1] if marks else None


def minutes(seconds):
    """'2 min 05 s' or '40 s'."""
    seconds = int(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class ActionModule(ActionBase):
    """See library/llama_build_wait.py for the documentation."""

    TRANSFERS_FILES = False

    def _async(self, jid, mode, task_vars):
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        return self._execute_module(module_name="ansible.legacy.async_status", task_vars=task_vars,
                                    module_args={"jid": jid, "mode": mode, "_async_dir": async_dir})

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        jid, log, what = str(args.get("jid") or ""), str(args.get("log") or ""), str(args.get("name") or "the build")
        if not jid or not log:
            return dict(result, failed=True, msg="llama_build_wait: jid and log are required")
        interval, timeout = float(args.get("interval", 10)), float(args.get("timeout", 14400))
        host = task_vars.get("inventory_hostname", "?")
        started, shown = time.monotonic(), None
        while True:
            status = self._async(jid, "status", task_vars)
            if status.get("finished") or status.get("failed"):
                break
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                return dict(result, failed=True, msg=f"{host}: {what} still running after {minutes(elapsed)}; "
                                                     f"its output: {log}")
            tail = self._low_level_execute_command(f"tail -c 4096 {shlex.quote(log)}").get("stdout", "")
            mark = progress(tail) or "configured, starting"
            if mark != shown:
                display.display(f"{host}: {what}: {mark} after {minutes(elapsed)}")
                shown = mark
            time.sleep(interval)
        self._async(jid, "cleanup", task_vars)
        result.update({key: value for key, value in status.items() if key not in ("ansible_job_id", "finished")})
        if result.get("rc", 0) != 0 or result.get("failed"):
            tail = self._low_level_execute_command(f"tail -n 40 {shlex.quote(log)}").get("stdout", "")
            result.update(failed=True, msg=f"{host}: {what} failed (exit status {result.get('rc')}); the end of "
                                           f"{log}:\n{tail}")
            return result
        display.display(f"{host}: {what}: done in {minutes(time.monotonic() - started)}")
        result["changed"] = True
        return result
