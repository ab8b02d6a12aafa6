"""The vulkan scenario's fixtures; helpers come from molecule/shared/cluster_helpers.py (PYTHONPATH)."""

from cluster_helpers import master, workers  # noqa: F401 (fixtures)
