"""The tls scenario's fixtures; helpers come from molecule/shared/cluster_helpers.py (PYTHONPATH)."""

import pytest
from cluster_helpers import WORKERS, connect

# The cluster as site.yml left it first; then the runs that change it: check mode, bad input, renewal, and last
# the switch to plain and back (which also measures both transports).
ORDER = ["test_tls.py", "test_check_mode.py", "test_bad_input.py", "test_renewal.py", "test_transport_switch.py"]


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return ORDER.index(name) if name in ORDER else len(ORDER)
    items.sort(key=rank)


@pytest.fixture(scope="session")
def master():
    return connect("master")


@pytest.fixture(scope="session")
def workers():
    return {name: connect(name) for name in WORKERS}
