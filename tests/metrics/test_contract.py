"""The metric contract: naming, lookup, catalog order, and what importing it pulls in."""

from __future__ import annotations

import re
import subprocess
import sys
from types import ModuleType

import pytest

from fleetscope import metrics
from fleetscope.collectors import REGISTRY
from fleetscope.collectors.protocol import collector_class
from fleetscope.metrics import (
    ALL_TABLES,
    MetricSpec,
    efa,
    ena,
    engine,
    gpu,
    http,
    lookup,
    nccl,
    netdev,
    netstat,
    push,
    training,
)

MODULES = (efa, ena, engine, gpu, netdev, netstat, push, training, nccl, http)


def constants(module: ModuleType) -> dict[str, MetricSpec]:
    return {name: value for name, value in vars(module).items() if isinstance(value, MetricSpec)}


def test_str_of_a_spec_is_its_name_so_promql_reads_naturally() -> None:
    assert str(training.STEPS_TOTAL) == "fleetscope_training_steps_total"
    assert f"rate({training.STEPS_TOTAL}[5m])" == "rate(fleetscope_training_steps_total[5m])"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_constant_is_its_metric_name_without_the_module_prefix(module: ModuleType) -> None:
    specs = constants(module)
    assert specs, "a contract module without metrics"
    for constant, spec in specs.items():
        assert constant == constant.upper(), constant
        assert spec.name == module.PREFIX + constant.lower(), constant


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_table_row_is_a_module_constant(module: ModuleType) -> None:
    """Nothing reaches the catalog without a constant rules and dashboards can import."""
    named = {spec.name for spec in constants(module).values()}
    tables = [value for value in vars(module).values() if isinstance(value, metrics.MetricTable)]
    assert tables
    for table in tables:
        assert {spec.name for spec in table} <= named, table.source


def test_every_metric_follows_the_naming_rules() -> None:
    for name, spec in metrics.BY_NAME.items():
        assert re.fullmatch(r"fleetscope_[a-z0-9_]+", name), name
        assert spec.help.strip(), f"{name} has no help"
        if spec.kind == "counter":
            assert name.endswith("_total"), name
        if spec.unit == "seconds":
            assert "_seconds" in name, name
        if spec.unit == "bytes":
            assert "_bytes" in name, name
        assert "job" not in spec.all_labels, f"{name}: use training_job, `job` is Prometheus's target label"


def test_a_spec_refuses_names_that_break_the_conventions() -> None:
    with pytest.raises(ValueError, match="namespace"):
        MetricSpec("gpu_temperature_celsius", "gauge", "x")
    with pytest.raises(ValueError, match="_total"):
        MetricSpec("fleetscope_x_errors", "counter", "x")
    with pytest.raises(ValueError, match="_info"):
        MetricSpec("fleetscope_x", "info", "x")
    with pytest.raises(ValueError, match="duplicate key"):
        metrics.spec.table("x", "x", [("a", training.LOSS), ("a", training.LOSS)])


def test_all_tables_are_in_catalog_order() -> None:
    assert [(t.source, t.collector) for t in ALL_TABLES] == [
        ("engine", "engine"), ("efa", "efa"), ("netdev", "netdev"), ("netstat", "netstat"), ("ena", "ena"),
        ("nvml", "gpu"), ("pci", "gpu"), ("xid", "gpu"), ("gpu_jobs", "gpu"), ("steps", "steps"),
        ("positions", "steps"), ("push", "steps"),
        ("nccl", "nccl"),
        ("http", "http"),
    ]


def test_lookup_by_name() -> None:
    assert lookup("fleetscope_gpu_xid_errors_total") is gpu.XID_ERRORS_TOTAL
    assert lookup(str(efa.VERBS_ERRORS_TOTAL)) is efa.VERBS_ERRORS_TOTAL
    assert lookup("fleetscope_ena_reset_reasons_total").labels == ("device", "reason")
    with pytest.raises(KeyError, match="fleetscope_gpu_temprature_celsius"):
        lookup("fleetscope_gpu_temprature_celsius")
    assert len(metrics.BY_NAME) == len({spec.name for table in ALL_TABLES for spec in table})


def test_every_registered_collector_exports_exactly_the_tables_naming_it() -> None:
    for name, entry in REGISTRY.items():
        assert tuple(collector_class(entry).tables) == tuple(t for t in ALL_TABLES if t.collector == name), name
    assert {t.collector for t in ALL_TABLES} == {"engine", *REGISTRY}


def test_the_contract_imports_neither_prometheus_client_nor_any_reader() -> None:
    """The contract and its catalog, not the two helpers that build ``prometheus_client`` families from it.

    ``metrics/families.py`` and ``metrics/detail.py`` are for the collectors and the engine; nothing of the
    contract imports them, so rules, dashboards and docs read it without the daemon's dependencies.
    """
    code = (
        "import sys, fleetscope.metrics, fleetscope.metrics.catalog, fleetscope.metrics.budget; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('prometheus_client', 'pynvml', 'fastapi') "
        "or m.startswith(('fleetscope.sources', 'fleetscope.collectors', 'fleetscope.push'))); "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
