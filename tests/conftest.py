"""Suite-wide settings: the project root, and a fresh controller artifact cache per suite run.

The cache is shared by every scenario of one run (llama.cpp is compiled once per suite and reused) and
emptied at the start of the next run, so the cluster scenario's compile count is measured from zero.
"""

import os
import shutil
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    cache = PROJECT / ".cache" / "suite-artifacts"
    if not hasattr(config, "workerinput"):
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
    os.environ.setdefault("LLAMA_ARTIFACT_CACHE", str(cache))


@pytest.fixture(scope="session")
def project():
    return PROJECT
