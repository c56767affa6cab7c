"""fleetscope: observability for GPU training clusters.

The per-node daemon lives in :mod:`fleetscope.serve.daemon`; the push client for
training loops in :mod:`fleetscope.client` (standard library only).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
