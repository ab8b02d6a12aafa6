"""The cuda scenario's fixtures (testinfra hosts)."""

import pytest
from cluster_helpers import connect


@pytest.fixture(scope="session")
def builder():
    return connect("builder")


@pytest.fixture(scope="session")
def node():
    return connect("node")
