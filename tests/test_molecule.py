"""Each molecule scenario, end to end: create, prepare, converge, idempotence, verify (testinfra), destroy.

The steps run one by one so that their times are measured: the summary at the end of the run prints each
scenario's converge and no-op re-run (idempotence) times and their ratio.
"""

import os
import re
import subprocess
import time

import pytest

# Cheapest first. `cluster` and `upgrade` each compile one llama.cpp tree (two commits, two sources);
# later scenarios reuse the suite's artifact cache.
SCENARIOS = ["chrony", "chrony_airgapped", "firewall", "network", "cluster", "tls", "upgrade"]
STEPS = ["destroy", "syntax", "create", "prepare", "converge", "idempotence", "verify"]


def slowest(output):
    """The `--durations` lines of a verify step's pytest run: molecule's frame and colours removed, the lines it
    wrapped (continued with a deeper indent) joined again."""
    lines = []
    for raw in output.splitlines():
        line = re.sub(r"^\s*│ ?", "", re.sub(r"\x1b\[[0-9;]*m", "", raw))
        if line.startswith("  ") and lines:
            lines[-1] += line.lstrip()
        else:
            lines.append(line)
    return [" ".join(line.split()) for line in lines if re.match(r"^\d+\.\d+s (call|setup|teardown)\b", line)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, project, step_times, slowest_tests):
    if not os.environ.get("LLAMA_TEST_IMAGE"):
        pytest.fail("LLAMA_TEST_IMAGE is not set: run through `make test` (it builds the image and fixtures)")
    try:
        for step in STEPS:
            started = time.monotonic()
            result = subprocess.run(["molecule", step, "-s", scenario], cwd=project, timeout=3600,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            step_times[scenario][step] = time.monotonic() - started
            print(result.stdout)  # shown by pytest when the scenario fails
            if step == "verify":
                slowest_tests[scenario] = slowest(result.stdout)
            assert result.returncode == 0, f"molecule {step} -s {scenario} failed (output above)"
    finally:
        subprocess.run(["molecule", "destroy", "-s", scenario], cwd=project, timeout=600)
