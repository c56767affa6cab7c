"""Capture a real node for a bug report or the library of real nodes, and replay it through the daemon.

``fleetscope capture`` reads what the collectors read (sysfs and procfs subtrees, the driver's kernel-log
lines, NVML through the real binding, ENA statistics), redacts every identity consistently and writes
one ``.tar.gz`` with a manifest (:mod:`fleetscope.capture.archive`); ``fleetscope simulate-node --from``
serves it through the real daemon anywhere (:mod:`fleetscope_sim.replay`).
"""
