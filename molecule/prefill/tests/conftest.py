"""The prefill scenario's fixtures; helpers come from molecule/shared (PYTHONPATH)."""

from cluster_helpers import master, order_tests, workers  # noqa: F401 (master, workers: fixtures)

# The cluster as site.yml left it first (its TLS layer, its status, which stops and starts a terminator, and the fresh
# hosts' check-mode run prepare.yml recorded); then the runs that change it: bad input, renewal (followed by the
# converged check-mode run), the switch to plain and back (which also measures both transports); last the pre-fill's
# tests, which empty the caches, and whose switch leaves another model served than the inventory names.
ORDER = ["test_tls.py", "test_tls_status.py", "test_check_mode.py", "test_tls_bad_input.py", "test_tls_renewal.py",
         "test_transport_switch.py", "test_prefill.py"]


def pytest_collection_modifyitems(items):
    order_tests(items, ORDER)
