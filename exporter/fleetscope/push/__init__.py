"""The daemon's push receiver: step records from training jobs and Pushgateway-style groups.

``models`` (wire format), ``store`` (per-rank state), ``gateway`` (groups),
``api`` (FastAPI routes), ``tables`` (metric names). The collector
:mod:`fleetscope.collectors.steps` ties them to the daemon.
"""
