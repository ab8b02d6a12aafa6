"""Each molecule scenario, end to end: create, converge, idempotence, verify (testinfra), destroy."""

import os
import subprocess

import pytest

# Cheapest first; `cluster` compiles llama.cpp (once for the whole suite).
SCENARIOS = ["chrony", "chrony_airgapped", "cluster"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, project):
    if not os.environ.get("LLAMA_TEST_IMAGE"):
        pytest.fail("LLAMA_TEST_IMAGE is not set: run through `make test` (it builds the image and fixtures)")
    result = subprocess.run(["molecule", "test", "-s", scenario], cwd=project, timeout=3600)
    assert result.returncode == 0, f"molecule test -s {scenario} failed (output above)"
