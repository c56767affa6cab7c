"""Wiring the engine from a Config: which collectors may pause while nothing scrapes."""

from __future__ import annotations

from fleetscope.config import load
from fleetscope.serve.daemon import build_engine
from fleetscope.serve.engine import IDLE_AFTER, CollectorRunner


def _runners(flags: dict[str, str]) -> dict[str, CollectorRunner]:
    config = load(flags, environ={})
    engine = build_engine(config, {name: object() for name in ("efa", "netdev", "gpu", "nccl")})
    return {r.name: r for r in engine.runners if isinstance(r, CollectorRunner)}


def test_collectors_pause_after_the_lookback_window_except_those_following_a_stream() -> None:
    runners = _runners({})
    assert runners["efa"].pausable and runners["netdev"].pausable
    assert runners["efa"].idle_after == IDLE_AFTER == 300
    assert not runners["gpu"].pausable  # the kernel log
    assert not runners["nccl"].pausable  # the Inspector's growing files


def test_pause_after_is_a_setting_and_zero_turns_pausing_off() -> None:
    assert _runners({"collection.pause-after": "45s"})["efa"].idle_after == 45
    runners = _runners({"collection.pause-after": "0"})
    assert not any(r.pausable for r in runners.values())
