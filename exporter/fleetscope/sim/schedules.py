"""Built-in fault schedules: the demo's, and the one the end-to-end test runs."""

from __future__ import annotations

from typing import Any

# What a newcomer watches in `fleetscope demo` (8 nodes, job-a on node-00..03, job-b on node-04..07).
DEMO_SCHEDULE: dict[str, Any] = {
    "faults": [
        {"kind": "thermal_throttle", "at": "2m", "node": "node-01", "gpu": 3},
        {"kind": "efa_retransmits", "at": "3m", "node": "node-05", "device": "rdmap16s27"},
        {"kind": "xid", "at": "4m", "node": "node-06", "gpu": 5, "params": {"xid": 48}},
        {"kind": "slow_dataloader", "at": "5m", "job": "job-b", "rank": 9},
        {"kind": "tcp_retransmit_storm", "at": "6m", "duration": "4m", "node": "node-02"},
    ],
}
