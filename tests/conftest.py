"""Suite-wide settings: the project root, a fresh controller artifact cache per suite run, step timings.

The cache is shared by every scenario of one run (llama.cpp is compiled once per suite and reused) and
emptied at the start of the next run, so the cluster scenario's compile count is measured from zero.
"""

import collections
import os
import shutil
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
STEP_TIMES = collections.defaultdict(dict)


def pytest_configure(config):
    cache = PROJECT / ".cache" / "suite-artifacts"
    if not hasattr(config, "workerinput"):
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
    os.environ.setdefault("LLAMA_ARTIFACT_CACHE", str(cache))


@pytest.fixture(scope="session")
def project():
    return PROJECT


@pytest.fixture(scope="session")
def step_times():
    """{scenario: {molecule step: seconds}}, printed at the end of the run."""
    return STEP_TIMES


def pytest_terminal_summary(terminalreporter):
    """Converge and no-op re-run (idempotence) times of each scenario, measured in this run."""
    timed = {name: steps for name, steps in STEP_TIMES.items() if "idempotence" in steps}
    if not timed:
        return
    terminalreporter.section("converge vs no-op re-run (this run)")
    for name, steps in timed.items():
        converge, rerun = steps["converge"], steps["idempotence"]
        terminalreporter.write_line(f"{name:18} converge {converge:7.1f} s   no-op re-run {rerun:6.1f} s   "
                                    f"ratio {rerun / converge:.3f}")
