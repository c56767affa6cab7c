"""EFA counter scopes: every counter file of a current driver has one curated metric, in one scope."""

from __future__ import annotations

import random

from fleetscope.metrics import efa
from tests.fixtures import make_fixtures as mk


def test_scopes_cover_every_driver_counter_once() -> None:
    assert set(mk.efa_port_counters(random.Random(0))) == efa.PORT_COUNTERS
    assert not efa.PORT_COUNTERS & efa.DEVICE_COUNTERS
    assert {"submitted_cmds", "cmds_err", "alloc_pd_err", "get_dma_mr_err"} <= efa.DEVICE_COUNTERS
    assert "lifespan" not in efa.PORT_COUNTERS | efa.DEVICE_COUNTERS
    for raw in efa.PORT_COUNTERS | efa.DEVICE_COUNTERS:
        assert efa.TABLE[raw].kind == "counter"
    for raw in efa.PORT_COUNTERS:
        assert efa.TABLE[raw].labels == ("device", "port")
