"""The prefill scenario's fixtures; helpers come from molecule/shared (PYTHONPATH)."""

from cluster_helpers import master, workers  # noqa: F401 (fixtures)
