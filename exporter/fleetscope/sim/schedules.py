"""Built-in fault schedules: the demo's, and the one the end-to-end test runs."""

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
        {"kind": "job_hang", "at": "5m", "job": "job-b", "params": {"first_rank": 20, "lag": 10}},
    ],
}
