"""The cluster scenario's fixtures; helpers come from molecule/shared/cluster_helpers.py (PYTHONPATH)."""

from cluster_helpers import master, order_tests, workers  # noqa: F401 (master, workers: fixtures)

# The measurements of the cluster as site.yml left it come first; the runs that change it, and the bench
# (which loads the whole model on each worker in turn and so inflates its memory), come last.
# The models' tests (another model, a share, new content at one path) last: each puts the inventory's model back.
ORDER = ["test_cluster.py", "test_timesync.py", "test_status.py", "test_monitor.py", "test_collection.py", "test_check_mode.py",
         "test_security.py", "test_bad_input.py",
         "test_tags.py", "test_front.py", "test_calibrate.py", "test_models.py"]


def pytest_collection_modifyitems(items):
    order_tests(items, ORDER)
