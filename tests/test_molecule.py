"""Each molecule scenario, end to end: create, converge, idempotence, verify (testinfra), destroy."""

import os
import subprocess

import pytest

# Cheapest first. `cluster` and `build_git` each compile one llama.cpp tree (two commits, two sources);
# later scenarios reuse the suite's artifact cache.
SCENARIOS = ["chrony", "chrony_airgapped", "cluster", "build_git"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, project):
    if not os.environ.get("LLAMA_TEST_IMAGE"):
        pytest.fail("LLAMA_TEST_IMAGE is not set: run through `make test` (it builds the image and fixtures)")
    result = subprocess.run(["molecule", "test", "-s", scenario], cwd=project, timeout=3600)
    assert result.returncode == 0, f"molecule test -s {scenario} failed (output above)"
