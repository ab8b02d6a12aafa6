"""Action plugin llama_job_wait: wait for a job started in the background (a compilation, a pre-fill, a model load),
showing how far it is."""

from __future__ import annotations

import re
import shlex
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

_NINJA = re.compile(r"\[(\d+)/(\d+)\]")
_MAKE = re.compile(r"\[\s*(\d+)%\]")
# The project's own jobs (plugins/module_utils/llama_tensor_hash.Progress, llama_health_wait): a whole line of their words.
_OWN = re.compile(r"^progress: ([^\r\n]+)", re.M)


def progress(text):
    """The last progress mark of a job's output: '123 of 456 steps' (ninja's [n/N]), '45%' (make's [ 45%]), the text
    of a `progress: ...` line (the project's own jobs), or None before the first."""
    marks = [(match.start(), f"{match.group(1)} of {match.group(2)} steps") for match in _NINJA.finditer(text)]
    marks += [(match.start(), f"{match.group(1)}%") for match in _MAKE.finditer(text)]
    marks += [(match.start(), match.group(1)) for match in _OWN.finditer(text[:text.rfind("\n") + 1])]
    return max(marks)[1] if marks else None


def fraction(mark):
    """How far a build tool's mark says the job is (0 to 1), None for the project's own marks (already whole
    sentences that never go back)."""
    steps = re.fullmatch(r"(\d+) of (\d+) steps", mark or "")
    if steps:
        return int(steps.group(1)) / max(int(steps.group(2)), 1)
    percent = re.fullmatch(r"(\d+)%", mark or "")
    return int(percent.group(1)) / 100 if percent else None


def forward(mark, best):
    """(the mark to show, the furthest fraction so far): a build tool's mark that is behind one shown already is not
    shown. make prints each target's own percentage as it builds targets one after another (98 % of one, then 90 %
    of the next): shown as they come, the progress would go backwards."""
    done = fraction(mark)
    if done is None:
        return mark, best
    if best is not None and done < best:
        return None, best
    return mark, done


def minutes(seconds):
    """'2 min 05 s' or '40 s'."""
    seconds = int(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class ActionModule(ActionBase):
    """See plugins/modules/llama_job_wait.py for the documentation."""

    TRANSFERS_FILES = False

    def _async(self, jid, mode, task_vars):
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        return self._execute_module(module_name="ansible.legacy.async_status", task_vars=task_vars,
                                    module_args={"jid": jid, "mode": mode, "_async_dir": async_dir})

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        jid, log, what = str(args.get("jid") or ""), str(args.get("log") or ""), str(args.get("name") or "the job")
        if not jid or not log:
            return dict(result, failed=True, msg="llama_job_wait: jid and log are required")
        interval, timeout = float(args.get("interval", 10)), float(args.get("timeout", 14400))
        host = task_vars.get("inventory_hostname", "?")
        started, shown, best = time.monotonic(), None, None
        while True:
            status = self._async(jid, "status", task_vars)
            if status.get("finished") or status.get("failed"):
                break
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                return dict(result, failed=True, msg=f"{host}: {what} still running after {minutes(elapsed)}; "
                                                     f"its output: {log}")
            tail = self._low_level_execute_command(f"tail -c 4096 {shlex.quote(log)}").get("stdout", "")
            mark, best = forward(progress(tail) or args.get("starting", "configured, starting"), best)
            if mark is not None and mark != shown:
                display.display(f"{host}: {what}: {mark} after {minutes(elapsed)}")
                shown = mark
            time.sleep(interval)
        self._async(jid, "cleanup", task_vars)
        result.update({key: value for key, value in status.items() if key not in ("ansible_job_id", "finished")})
        if "rc" not in result and "msg" in result:  # a module's own result: its message says what went wrong
            if result.get("failed"):
                result["msg"] = f"{host}: {what} failed: {result['msg']}"
                return result
        elif result.get("rc", 0) != 0 or result.get("failed"):
            tail = self._low_level_execute_command(f"tail -n 40 {shlex.quote(log)}").get("stdout", "")
            result.update(failed=True, msg=f"{host}: {what} failed (exit status {result.get('rc')}); the end of "
                                           f"{log}:\n{tail}")
            return result
        display.display(f"{host}: {what}: done in {minutes(time.monotonic() - started)}")
        result.setdefault("changed", True)
        return result
