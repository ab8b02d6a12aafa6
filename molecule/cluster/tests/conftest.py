"""The cluster scenario's fixtures; helpers come from molecule/shared/cluster_helpers.py (PYTHONPATH)."""

import pytest
from cluster_helpers import WORKERS, connect

# The measurements of the cluster as site.yml left it come first; the runs that change it, and the bench
# (which loads the whole model on each worker in turn and so inflates its memory), come last.
ORDER = ["test_cluster.py", "test_check_mode.py", "test_security.py", "test_bad_input.py", "test_tags.py",
         "test_bench.py"]


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
