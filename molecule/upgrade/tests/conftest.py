"""The upgrade scenario's order: the converge's checks (the older tree built from git), then the upgrade tests, a
chain in which each test starts from the state the one before left: after a failure the rest are skipped, naming
it. Helpers come from molecule/shared/cluster_helpers.py (PYTHONPATH)."""

from cluster_helpers import Chain, order_tests

ORDER = ["test_git_build.py", "test_upgrade.py"]
CHAIN = Chain()


def pytest_collection_modifyitems(items):
    order_tests(items, ORDER)


def pytest_runtest_setup(item):
    if item.path.name == "test_upgrade.py":
        CHAIN.setup(item)


def pytest_runtest_makereport(item, call):
    if item.path.name == "test_upgrade.py":
        CHAIN.report(item, call)
