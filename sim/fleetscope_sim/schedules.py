"""Built-in fault schedules, chosen by name with ``--faults NAME`` (a file name otherwise)."""

from __future__ import annotations

from typing import Any

# What a newcomer watches in `fleetscope demo` (8 nodes, job-a on node-00..03, job-b on node-04..07):
# one fault a minute, each raising a different alert with the compressed rules (see docs/demo.md).
DEMO_SCHEDULE: dict[str, Any] = {
    "faults": [
        {"kind": "thermal_throttle", "at": "1m", "node": "node-01", "gpu": 3},
        {"kind": "efa_retransmits", "at": "2m", "node": "node-05", "device": "rdmap16s27"},
        {"kind": "xid", "at": "3m", "node": "node-06", "gpu": 5, "params": {"xid": 48}},
        {"kind": "tcp_retransmit_storm", "at": "4m", "duration": "4m", "node": "node-02"},
        {"kind": "job_hang", "at": "5m", "job": "job-b", "rank": 20, "params": {"phase": "data"}},
    ],
}

# The shortest story with an alert at its end, for install checks (`fleetscope demo --nodes 1
# --faults smoke --check`): an Xid 48 on the first node, raised within seconds of the event.
SMOKE_SCHEDULE: dict[str, Any] = {
    "faults": [
        {"kind": "xid", "at": "15s", "node": "node-00", "gpu": 1, "params": {"xid": 48}},
    ],
}

SCHEDULES: dict[str, dict[str, Any]] = {"demo": DEMO_SCHEDULE, "smoke": SMOKE_SCHEDULE}
