"""Detail levels: series combined at the default level, and summed counters that stay counters."""

from __future__ import annotations

import pytest
from prometheus_client.core import Metric

from fleetscope.metrics import MetricSpec
from fleetscope.metrics.detail import Detail
from fleetscope.metrics.spec import AtDefault

BYTES = MetricSpec("fleetscope_test_bytes_total", "counter", "Bytes.", ("device", "port"),
                   at_default=AtDefault((), why="node"))
ERRORS = MetricSpec("fleetscope_test_errors_total", "counter", "Errors.", ("device", "kind"),
                    at_default=AtDefault(("kind",), why="node"))
UP = MetricSpec("fleetscope_test_link_up", "gauge", "Up.", ("gpu", "link"), at_default=AtDefault(("gpu",), "min"))
PER_DEVICE = MetricSpec("fleetscope_test_failures_total", "counter", "Failures.", ("device",))
CONSTANT = MetricSpec("fleetscope_test_max", "gauge", "Max.", ("gpu",), at_default=AtDefault(None))
SECONDS = MetricSpec("fleetscope_test_seconds_total", "counter", "Seconds.", ("gpu", "reason"))
ACTIVE = MetricSpec("fleetscope_test_active", "gauge", "Active.", ("gpu", "reason"),
                    at_default=AtDefault(("gpu", "reason"), unless="fleetscope_test_seconds_total"))


def values(families: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def collect(detail: Detail, bytes_by_device: dict[str, float]) -> float | None:
    builder = detail.builder()
    for device, value in bytes_by_device.items():
        builder.add(BYTES, (device, "1"), value)
    return values(builder.families()).get(("fleetscope_test_bytes_total", ()))


def test_default_combines_series_and_all_keeps_them() -> None:
    for level, expected in (("default", 4), ("all", 8)):
        builder = Detail(level).builder()  # type: ignore[arg-type]
        builder.add(BYTES, ("a", "1"), 10)
        builder.add(BYTES, ("b", "1"), 5)
        builder.add(ERRORS, ("a", "crc"), 1)
        builder.add(ERRORS, ("b", "crc"), 2)
        builder.add(UP, ("0", "1"), 1)
        builder.add(UP, ("0", "2"), 0)
        builder.add(PER_DEVICE, ("a",), 3)
        builder.add(PER_DEVICE, ("b",), None)  # not read: absent, never 0
        builder.add(CONSTANT, ("0",), 1980)
        got = values(builder.families())
        assert len(got) == expected, got
    assert got[("fleetscope_test_link_up", (("gpu", "0"), ("link", "2")))] == 0
    builder = Detail("default").builder()
    builder.add(BYTES, ("a", "1"), 10)
    builder.add(BYTES, ("b", "1"), 5)
    builder.add(ERRORS, ("a", "crc"), 1)
    builder.add(ERRORS, ("b", "crc"), 2)
    builder.add(UP, ("0", "1"), 1)
    builder.add(UP, ("0", "2"), 0)
    builder.add(PER_DEVICE, ("a",), 3)
    builder.add(CONSTANT, ("0",), 1980)
    families = builder.families()
    assert values(families) == {
        ("fleetscope_test_bytes_total", ()): 15,
        ("fleetscope_test_errors_total", (("kind", "crc"),)): 3,
        ("fleetscope_test_link_up", (("gpu", "0"),)): 0,  # lowest over its links: one is down
        ("fleetscope_test_failures_total", (("device", "a"),)): 3,
    }
    # families keep the order their metrics were first added in, and say what was combined
    assert [f.name for f in families] == ["fleetscope_test_bytes", "fleetscope_test_errors", "fleetscope_test_link_up",
                                          "fleetscope_test_failures"]
    assert families[0].documentation == "Bytes. At detail level default: summed over device, port."


def test_a_series_another_metric_says_better_is_left_out() -> None:
    builder = Detail("default").builder()
    builder.add(ACTIVE, ("0", "sw_power_cap"), 1)
    builder.add(ACTIVE, ("0", "hw_slowdown"), 0)
    builder.add(SECONDS, ("0", "sw_power_cap"), 12.5)
    assert values(builder.families()) == {
        ("fleetscope_test_seconds_total", (("gpu", "0"), ("reason", "sw_power_cap"))): 12.5,
        ("fleetscope_test_active", (("gpu", "0"), ("reason", "hw_slowdown"))): 0,
    }


def test_a_summed_counter_survives_one_device_resetting() -> None:
    detail = Detail("default")
    assert collect(detail, {"a": 100, "b": 1000}) == 1100
    assert collect(detail, {"a": 150, "b": 1000}) == 1150
    # b is re-probed and starts again from 0: the sum goes on from where it was, it does not drop by 1000
    assert collect(detail, {"a": 160, "b": 7}) == 1167
    assert collect(detail, {"a": 170, "b": 9}) == 1179


def test_a_summed_counter_survives_a_device_disappearing_and_coming_back() -> None:
    detail = Detail("default")
    assert collect(detail, {"a": 100, "b": 1000}) == 1100
    assert collect(detail, {"a": 120}) == 1120  # b gone (or unreadable): its last total still counts
    assert collect(detail, {"a": 130, "b": 1010}) == 1140  # back where it was: no double count
    assert collect(detail, {"a": 140, "b": 3}) == 1153  # back after a reset


def test_every_device_resetting_keeps_the_sum_growing() -> None:
    detail = Detail("default")
    collect(detail, {"a": 5e15, "b": 5e15})
    assert collect(detail, {"a": 10, "b": 20}) == pytest.approx(1e16 + 30)


def test_a_metric_no_device_reports_any_more_is_absent() -> None:
    detail = Detail("default")
    assert collect(detail, {"a": 100}) == 100
    assert collect(detail, {}) is None


def test_sums_never_step_down_by_rounding() -> None:
    detail = Detail("default")
    big = 2.0**53
    previous = 0.0
    for step in range(50):
        reading = {f"d{i}": big + step * 3 + i for i in range(32)}
        if step % 7 == 3:
            reading.pop("d5")  # a device unread now and then changes the order of the sum
        total = collect(detail, reading)
        assert total is not None and total >= previous
        previous = total


def test_info_metrics_are_kept_or_left_out_whole() -> None:
    with pytest.raises(ValueError, match="info metric cannot be combined"):
        MetricSpec("fleetscope_test_info", "info", "Info.", ("device",), info_keys=("fw",),
                   at_default=AtDefault(()))
    with pytest.raises(ValueError, match="counters are combined by sum"):
        MetricSpec("fleetscope_test_x_total", "counter", "X.", ("device",), at_default=AtDefault((), "max"))
    with pytest.raises(ValueError, match="keeps labels"):
        MetricSpec("fleetscope_test_y", "gauge", "Y.", ("device",), at_default=AtDefault(("gpu",)))
