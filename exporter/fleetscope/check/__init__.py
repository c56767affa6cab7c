"""How a node and its fleet are judged: ``fleetscope check``.

:mod:`.run` runs every collector's health check and writes the verdict (exit
0, 1 or 2); :mod:`.prometheus` asks Prometheus for the cross-node verdicts;
:mod:`.verdicts` defines those conditions in PromQL, shared with the rules
that alert on them. Nothing is imported here, so :mod:`fleetscope.rules` can
import :mod:`.verdicts` without the checker.
"""
