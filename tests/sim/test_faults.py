from __future__ import annotations

import math

import pytest
import yaml

from fleetscope_sim.cluster import make_cluster
from fleetscope_sim.faults import KINDS, ScheduleError, load_schedule, parse_schedule


def test_schedule_parses_durations_targets_and_params(tmp_path):
    path = tmp_path / "faults.yml"
    path.write_text(yaml.safe_dump({"faults": [
        {"kind": "rank_dies", "at": "90s", "job": "job-b", "rank": 5},
        {"kind": "thermal_throttle", "at": "1m", "duration": "2m", "node": "node-03", "gpu": 2,
         "params": {"slowdown": 1.5}},
    ]}))
    first, second = load_schedule(str(path))
    assert (first.kind, first.at, first.duration, first.node, first.gpu) == \
        ("thermal_throttle", 60.0, 120.0, "node-03", 2)
    assert first.param("slowdown") == 1.5
    assert first.param("clock_ratio") == KINDS["thermal_throttle"].defaults["clock_ratio"]
    assert second.kind == "rank_dies" and second.duration == math.inf
    assert first.active(60.0) and first.active(179.9) and not first.active(180.0) and not first.active(59.9)


@pytest.mark.parametrize("raw, message", [
    ({"kind": "meteor", "at": 1}, "unknown kind"),
    ({"kind": "xid", "at": 1, "node": "node-00", "gpu": 0}, "params.xid"),
    ({"kind": "xid", "at": 1, "node": "node-00", "params": {"xid": 79}}, "needs gpu"),
    ({"kind": "rank_dies", "at": 1, "job": "job-a"}, "needs rank"),
    ({"kind": "efa_rx_drops", "at": "soon", "node": "node-00"}, "duration"),
    ({"kind": "efa_rx_drops", "at": 1, "node": "node-00", "params": {"speed": 3}}, "takes no params"),
    ({"kind": "efa_rx_drops", "at": 1, "node": "node-00", "colour": "red"}, "unknown keys"),
])
def test_schedule_rejects_what_it_cannot_run(raw, message):
    with pytest.raises(ScheduleError, match=message):
        parse_schedule({"faults": [raw]})


def test_cluster_refuses_faults_on_missing_hardware():
    with pytest.raises(ValueError, match="no GPU 8"):
        make_cluster(nodes=2, jobs=1, faults=parse_schedule(
            [{"kind": "row_remap_pending", "at": 1, "node": "node-00", "gpu": 8}]))
    with pytest.raises(ValueError, match="no device"):
        # node-01 is a p4d: it has 4 EFA devices, none with a p5 name.
        make_cluster(nodes=2, jobs=1, faults=parse_schedule(
            [{"kind": "efa_rx_drops", "at": 1, "node": "node-01", "device": "rdmap79s0"}]))
    with pytest.raises(ValueError, match="has no rank 16"):
        make_cluster(nodes=2, jobs=1,
                     faults=parse_schedule([{"kind": "rank_dies", "at": 1, "job": "job-a", "rank": 16}]))


def test_every_fault_kind_has_a_working_default_schedule_entry():
    # Each kind must be constructible from its documented target alone (plus required params).
    for kind in KINDS.values():
        raw: dict = {"kind": kind.name, "at": "10s"}
        raw.update({"gpu": {"node": "node-00", "gpu": 1}, "efa": {"node": "node-00"}, "ena": {"node": "node-00"},
                    "node": {"node": "node-00"}, "rank": {"job": "job-a", "rank": 3},
                    "job": {"job": "job-a"}}[kind.target])
        if kind.required:
            raw["params"] = dict.fromkeys(kind.required, 79)
        make_cluster(nodes=2, jobs=1, faults=parse_schedule([raw]))
