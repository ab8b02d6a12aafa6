"""The mixed scenario's order: the converged cluster's checks and the refusals (which change nothing), then the
instances and the upgrade, then worker2 as a master: a chain in which each test starts from the state the one before
left: after a failure the rest are skipped, naming it. Helpers and the master/workers fixtures come from molecule/shared/cluster_helpers.py (PYTHONPATH)."""

from cluster_helpers import Chain, master, order_tests, workers  # noqa: F401  # pylint: disable=unused-import

# The instances' last run removes them again, leaving the upgraded cluster.
ORDER = ["test_mixed.py", "test_instances.py", "test_debian13_master.py"]
CHAIN = Chain()


def pytest_collection_modifyitems(items):
    order_tests(items, ORDER)


def pytest_runtest_setup(item):
    CHAIN.setup(item)


def pytest_runtest_makereport(item, call):
    CHAIN.report(item, call)
