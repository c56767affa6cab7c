"""Sources: read and parse raw data into typed values.

One module per data source. Sources never import ``prometheus_client``;
every filesystem path is built from a :class:`fleetscope.sources.fs.Root`
(``--path.sysfs`` / ``--path.procfs``), never hard-coded.
"""
