"""The tls scenario's fixtures; helpers come from molecule/shared/cluster_helpers.py (PYTHONPATH)."""

from cluster_helpers import master, order_tests, workers  # noqa: F401 (master, workers: fixtures)

# The cluster as site.yml left it first, then its status (which stops and starts a terminator), and the fresh hosts'
# check-mode run prepare.yml recorded; then the runs that change it: bad input, renewal (followed by the converged
# check-mode run), and last the switch to plain and back (which also measures both transports).
ORDER = ["test_tls.py", "test_status.py", "test_check_mode.py", "test_bad_input.py", "test_renewal.py",
         "test_transport_switch.py"]


def pytest_collection_modifyitems(items):
    order_tests(items, ORDER)
