from __future__ import annotations

from fleetscope_sim.detection import (
    AlertPattern,
    AlertWatcher,
    Expectation,
    Sighting,
    evaluate,
    render_report,
)
from fleetscope_sim.faults import parse_schedule

T0 = 1_800_000_000.0


def _fault(raw):
    return parse_schedule([raw])[0]


def test_pattern_matches_a_label_subset_and_alternatives():
    pattern = AlertPattern("EnaAllowanceExceeded", {"instance": "node-03", "allowance": ("bw_in", "bw_out")})
    assert pattern.matches({"alertname": "EnaAllowanceExceeded", "instance": "node-03", "allowance": "bw_in", "x": "y"})
    assert not pattern.matches({"alertname": "EnaAllowanceExceeded", "instance": "node-03", "allowance": "pps"})
    assert not pattern.matches({"alertname": "EnaAllowanceExceeded", "instance": "node-04", "allowance": "bw_in"})
    assert not pattern.matches({"alertname": "Other", "instance": "node-03", "allowance": "bw_in"})


def test_evaluate_times_detection_and_separates_wrong_labels_consequences_and_strays():
    throttle = _fault({"kind": "thermal_throttle", "at": 60, "node": "node-00", "gpu": 3})
    hang = _fault({"kind": "job_hang", "at": 100, "job": "job-d", "rank": 9})
    expectations = [
        Expectation(throttle, (AlertPattern("GpuThrottled", {"instance": "node-00", "gpu": "3"}),), 120,
                    tolerated=(AlertPattern("GpuTemperatureNearSlowdown", {"instance": "node-00", "gpu": "3"}),)),
        Expectation(hang, (AlertPattern("TrainingJobHang", {"training_job": "job-d", "rank": "9"}),), 60),
    ]
    sightings = [
        Sighting({"alertname": "GpuThrottled", "instance": "node-00", "gpu": "3"}, T0 + 150),
        Sighting({"alertname": "GpuTemperatureNearSlowdown", "instance": "node-00", "gpu": "3"}, T0 + 140),
        Sighting({"alertname": "TrainingJobHang", "training_job": "job-d", "rank": "9"}, T0 + 200),  # too late
        Sighting({"alertname": "TrainingJobHang", "training_job": "job-d", "rank": "4"}, T0 + 150),  # wrong rank
        Sighting({"alertname": "TcpRetransmitRatioHigh", "instance": "node-07"}, T0 + 90),  # nobody's fault
    ]
    outcomes, strays = evaluate(expectations, sightings, T0)
    first, second = outcomes
    assert first.passed and first.detect_seconds == 90
    assert second.fired and not second.labels_right and second.detect_seconds == 100 and not second.passed
    assert [s.labels["rank"] for s in second.wrong_labels] == ["4"]
    assert sorted(s.labels["alertname"] for s in strays) == ["TcpRetransmitRatioHigh", "TrainingJobHang"]
    report = render_report(outcomes, strays, [], {"Run": "unit"})
    assert "| thermal_throttle | node-00, gpu 3 | t+60 s |" in report and "| 90 s | 120 s | pass |" in report
    assert "| 100 s | 60 s | FAIL |" in report
    assert "- TcpRetransmitRatioHigh (instance=node-07)" in report
    assert "**1 of 2 faults detected as intended; 2 stray alert(s) in the fault run; 0 alert(s)" in report


def test_an_alert_already_firing_before_the_fault_does_not_count_as_detection():
    fault = _fault({"kind": "tcp_retransmit_storm", "at": 100, "node": "node-01"})
    exp = Expectation(fault, (AlertPattern("TcpRetransmitRatioHigh", {"instance": "node-01"}),), 120)
    early = Sighting({"alertname": "TcpRetransmitRatioHigh", "instance": "node-01"}, T0 + 20)
    outcomes, strays = evaluate([exp], [early],
                                T0)
    assert not outcomes[0].fired and len(strays) == 1


def test_watcher_keeps_the_first_firing_time_and_ignores_pending_and_errors():
    answers = [
        [{"state": "pending", "labels": {"alertname": "A"}}],
        RuntimeError("prometheus restarting"),
        [{"state": "firing", "labels": {"alertname": "A"}}],
        [{"state": "firing", "labels": {"alertname": "A"}}, {"state": "firing", "labels": {"alertname": "B"}}],
    ]

    def fetch():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watcher = AlertWatcher(fetch)
    watcher.poll()
    assert watcher.sightings == {}
    watcher.poll()
    assert watcher.errors == 1
    watcher.poll()
    first_a = watcher.sightings[(("alertname", "A"),)].first_firing
    watcher.poll()
    assert watcher.sightings[(("alertname", "A"),)].first_firing == first_a
    assert set(watcher.sightings) == {(("alertname", "A"),), (("alertname", "B"),)}


def test_expectations_follow_the_cluster_layout():
    from fleetscope_sim.cluster import make_cluster
    from fleetscope_sim.detection import expectation

    faults = parse_schedule([
        {"kind": "thermal_throttle", "at": 60, "node": "node-01", "gpu": 3},
        {"kind": "hw_slowdown", "at": 60, "node": "node-02", "gpu": 5},
        {"kind": "slow_dataloader", "at": 60, "job": "job-a", "rank": 4},
        {"kind": "job_hang", "at": 60, "job": "job-a", "rank": 6},
    ])
    spec = make_cluster(nodes=3, jobs=1, faults=faults)  # job-a on all three nodes: ranks 0-23
    throttle, slowdown, loader, hang = (expectation(f, spec) for f in faults)
    assert [p.describe() for p in throttle.expected] == [
        "GpuThrottled{gpu=3, instance=node-01}", "TrainingStragglerRank{rank=11, training_job=job-a}",
        "NcclLateRank{rank=11, training_job=job-a}"]
    assert [p.describe() for p in slowdown.expected][1] == "TrainingStragglerRank{rank=21, training_job=job-a}"
    assert "TrainingNodeRepeatedlySlow{instance=node-02}" in [p.describe() for p in slowdown.tolerated]
    assert loader.expected[0].describe() == "TrainingRankInputBound{rank=4, training_job=job-a}"
    # A rank late for its input is late at every collective: the Inspector's alert may name it too.
    assert "NcclLateRank{rank=4, training_job=job-a}" in [p.describe() for p in loader.tolerated]
    assert hang.expected[0].describe() == "TrainingJobHang{rank=6, training_job=job-a}"
    # A GPU no job uses slows nobody: only the GPU alert is expected.
    idle = make_cluster(nodes=3, jobs=1, faults=faults[:1])
    idle = idle.__class__(idle.nodes, (), idle.faults)
    assert [p.alertname for p in expectation(faults[0], idle).expected] == ["GpuThrottled"]


def test_xid_alerts_follow_the_catalog_action():
    from fleetscope_sim.detection import xid_alert

    assert xid_alert(79) == "GpuXidRebootRequired"
    assert xid_alert(48) == "GpuXidResetRequired" and xid_alert(119) == "GpuXidResetRequired"
    assert xid_alert(94) == "GpuXidApplicationError" and xid_alert(13) == "GpuXidApplicationError"
    assert xid_alert(74) == "GpuXidNvlinkError"
    assert xid_alert(61) == "GpuXidNeedsInspection"  # CONTACT_SUPPORT


def test_an_alert_that_fired_before_its_fault_and_again_after_counts_once_and_is_also_a_stray():
    hang = _fault({"kind": "job_hang", "at": 100, "job": "job-b", "rank": 20})
    exp = Expectation(hang, (AlertPattern("TrainingJobHang", {"training_job": "job-b", "rank": "20"}),), 180)
    labels = {"alertname": "TrainingJobHang", "training_job": "job-b", "rank": "20"}
    # A false alarm at t+70 (resolved), then the real one at t+154.
    sighting = Sighting(labels, T0 + 70, [T0 + 70, T0 + 154])
    outcomes, strays = evaluate([exp], [sighting], T0)
    assert outcomes[0].passed and outcomes[0].detect_seconds == 54
    assert strays == [sighting]  # the false alarm is reported, not hidden by the later detection


def test_watcher_reports_firing_and_resolved_and_counts_episodes():
    answers = [
        [{"state": "firing", "labels": {"alertname": "A"}}],
        [],
        [{"state": "firing", "labels": {"alertname": "A"}}],
    ]
    watcher = AlertWatcher(lambda: answers.pop(0))
    assert [e.kind for e in watcher.poll()] == ["firing"]
    assert [(e.kind, e.labels["alertname"]) for e in watcher.poll()] == [("resolved", "A")]
    assert [e.kind for e in watcher.poll()] == ["firing"]
    assert len(watcher.sightings[(("alertname", "A"),)].firings) == 2
