"""A simulated GPU training cluster that runs through the real fleetscope pipeline.

Nodes are modelled here (GPU, EFA, ENA and TCP state that moves every tick);
each node's state is written to its own sysfs/procfs tree and NVML state file,
and served by the real daemon (``fleetscope simulate-node``). Training ranks
push step records through the real push API. Faults from a YAML schedule
change the model, so the shipped Prometheus rules can be watched firing.
"""
