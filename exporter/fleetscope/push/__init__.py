"""The daemon's push receiver: step records from training jobs and Pushgateway-style groups.

``models`` (wire format), ``store`` (per-rank state), Pushgateway-style groups in three layers:
``grouping`` (the grouping key's codec), ``textformat`` (a pushed body parsed and checked, no
settings) and ``groups`` (the group store, with plain limits); ``api`` (FastAPI routes). The collector
:mod:`fleetscope.collectors.steps` ties them to the daemon.
"""
