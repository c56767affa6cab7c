"""The GPU collector's cost per collection: on real NVML, or on the NVML fake's latency model (#25).

    python3 -m benchmarks.gpu_cost                       # 8 H100s with NVLink (p5) on the H100 latency model
    python3 -m benchmarks.gpu_cost --scenario h100_real --detail all --cycles 120

On real NVML a cycle costs its wall time. On the fake, the native library books each call the microseconds
its latency model gives it (measured on a real H100: ``fleetscope_sim.nvml_fake.scenarios/latency``) on a
virtual clock, and a cycle costs the collector's own CPU time (the ``pynvml`` binding and fleetscope; the
fake's own work left out) plus the NVML time booked. Either way the collector runs on a clock stepped one
collection interval per cycle, so its slow reads, spread over their interval, and its retries of
NOT_SUPPORTED answers come due as in a daemon collecting every ``interval`` seconds. The first cycle (NVML
opened, identities and constants read) is reported apart.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_SCENARIO = "h100_8x_healthy"
DEFAULT_INTERVAL = 10.0  # the gpu collector's default interval


class _Counted:
    """One C function of the library: counted (on the measuring thread), timed, then called."""

    def __init__(self, name: str, function: Any, counter: NativeCallCounter) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_function", function)
        object.__setattr__(self, "_counter", counter)

    def __call__(self, *args: Any) -> Any:
        if threading.get_ident() != self._counter.thread:
            return self._function(*args)
        started = time.perf_counter()
        result: Any = None
        try:
            result = self._function(*args)
            return result
        finally:
            self._counter.record(self._name, time.perf_counter() - started)
            if self._name == "nvmlDeviceGetFieldValues":
                self._counter.record_fields(args, result)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._function, name, value)  # pynvml sets restype on some functions


class NativeCallCounter:
    """Stands in for ``pynvml.nvmlLib`` (the real CDLL or the fake) and counts the calls one thread makes,
    and the field values it asks for."""

    def __init__(self, library: Any) -> None:
        self.library = library
        self.thread = threading.get_ident()
        self.calls: dict[str, list[float]] = {}  # symbol -> [calls, seconds]
        self.fields = 0
        self.by_field: dict[tuple[int, bool], int] = {}  # (field id, answered) -> times asked

    def __getattr__(self, name: str) -> Any:
        return _Counted(name, getattr(self.library, name), self)

    def record(self, name: str, seconds: float) -> None:
        spent = self.calls.setdefault(name, [0, 0.0])
        spent[0] += 1
        spent[1] += seconds

    def record_fields(self, args: tuple[Any, ...], result: Any) -> None:
        """The fields one ``nvmlDeviceGetFieldValues(handle, count, values)`` asked, each answered or refused."""
        count = int(getattr(args[1], "value", args[1]))
        self.fields += count
        if result != 0:  # the call failed: no field was answered or refused
            return
        values = getattr(args[2], "_obj", args[2])  # byref(array) or the array
        for i in range(count):
            key = (int(values[i].fieldId), int(values[i].nvmlReturn) == 0)
            self.by_field[key] = self.by_field.get(key, 0) + 1

    def reset(self) -> None:
        self.calls.clear()
        self.fields = 0
        self.by_field.clear()

    def total(self) -> tuple[int, int, float]:
        """(calls, fields, seconds inside the library) so far."""
        return (sum(int(c) for c, _ in self.calls.values()), self.fields, sum(s for _, s in self.calls.values()))

    @classmethod
    @contextlib.contextmanager
    def installed(cls) -> Iterator[NativeCallCounter]:
        import pynvml  # type: ignore[import-untyped]

        if pynvml.nvmlLib is None:  # not loaded yet (no fake installed, no session opened): load the real one
            pynvml._LoadNvmlLibrary()
        with pynvml.libLoadLock:
            library = pynvml.nvmlLib
            counter = cls(library)
            pynvml.nvmlLib = counter
            pynvml._nvmlGetFunctionPointer_cache.clear()
        try:
            yield counter
        finally:
            with pynvml.libLoadLock:
                pynvml.nvmlLib = library
                pynvml._nvmlGetFunctionPointer_cache.clear()


class _Meter:
    """A cycle's cost: wall time on real NVML; on the fake, own CPU time plus the NVML time its model booked."""

    def __init__(self, fake: Any = None) -> None:
        self.fake = fake

    def _now(self) -> tuple[float, float]:
        if self.fake is None:
            return time.perf_counter(), 0.0
        booked = self.fake.booked()
        return time.thread_time() - booked.own_seconds, booked.modelled_seconds

    @contextlib.contextmanager
    def cycle(self, into: list[tuple[float, float]]) -> Iterator[None]:
        own, modelled = self._now()
        yield
        own_after, modelled_after = self._now()
        into.append((own_after - own, modelled_after - modelled))


def collector_cost(cycles: int, settings: dict[str, Any] | None = None, interval: float = DEFAULT_INTERVAL,
                   fake: Any = None) -> dict[str, Any]:
    """The GPU collector's cost per cycle over ``cycles`` cycles after its first, on a clock stepped ``interval``
    seconds per cycle; ``fake``: the installed NVML fake, whose latency model the cost is measured on."""
    from fleetscope.collectors.gpu import GpuCollector
    from fleetscope.config import load

    clock = [time.monotonic()]
    collector = GpuCollector(load(settings or {}, environ={}), clock=lambda: clock[0])
    meter = _Meter(fake)
    first: list[tuple[float, float]] = []
    spent: list[tuple[float, float]] = []
    try:
        with NativeCallCounter.installed() as counter:
            with meter.cycle(first):
                families = collector.collect()
            first_calls, first_fields, _ = counter.total()
            counter.reset()
            for _ in range(cycles):
                clock[0] += interval
                with meter.cycle(spent):
                    collector.collect()
    finally:
        collector.close()
    gpus = _gpu_count(families)
    calls, fields, inside = counter.total()
    totals = sorted(own + modelled for own, modelled in spent)
    nvml_seconds = sum(modelled for _, modelled in spent) if fake is not None else inside

    def ms(seconds: float) -> float:
        return round(seconds * 1000, 3)

    return {
        "gpus": gpus,
        "cycles": cycles,
        "interval_s": interval,
        "on": "latency model" if fake is not None else "real NVML",
        "ms_median": ms(statistics.median(totals)),
        "ms_p95": ms(totals[min(len(totals) - 1, int(0.95 * len(totals)))]),
        "ms_max": ms(totals[-1]),
        "ms_mean": ms(statistics.fmean(totals)),
        "ms_per_gpu_median": ms(statistics.median(totals) / max(gpus, 1)),
        "ms_per_gpu_mean": ms(statistics.fmean(totals) / max(gpus, 1)),
        "nvml_ms_per_cycle": ms(nvml_seconds / cycles),
        "own_ms_per_cycle": ms(sum(own for own, _ in spent) / cycles),
        "nvml_calls_per_cycle": calls / cycles,
        "fields_per_cycle": fields / cycles,
        "first_cycle_ms": ms(sum(first[0])),
        "first_cycle_calls": first_calls,
        "first_cycle_fields": first_fields,
        "by_symbol": {name: {"calls_per_cycle": c / cycles, "us_per_call": round(s / c * 1e6, 1)}
                      for name, (c, s) in sorted(counter.calls.items(), key=lambda kv: -kv[1][1])},
        # field id -> how often it was answered and refused per cycle (what a latency model charges per field)
        "by_field": {str(field_id): {"answered_per_cycle": counter.by_field.get((field_id, True), 0) / cycles,
                                     "refused_per_cycle": counter.by_field.get((field_id, False), 0) / cycles}
                     for field_id in sorted({f for f, _ in counter.by_field})},
    }


def _gpu_count(families: list[Any]) -> int:
    for family in families:
        if family.name == "fleetscope_gpu_nvml_devices":
            return int(family.samples[0].value)
    return 0


def model_cost(scenario: str = DEFAULT_SCENARIO, latency: str | None = None, cycles: int = 60,
               interval: float = DEFAULT_INTERVAL, detail: str = "default") -> dict[str, Any]:
    """The collector's cost on the fake's latency model: ``scenario`` (a name or a path), with ``latency``
    (a model's name) in place of the scenario's own when given."""
    from fleetscope_sim.nvml_fake import LatencyModel, install, load_scenario, uninstall, write_sysfs

    with tempfile.TemporaryDirectory(prefix="fleetscope-gpu-cost-") as scratch:
        fake = load_scenario(_scenario_file(scenario, scratch))
        if latency is not None:
            fake.latency = LatencyModel.named(latency)
        if fake.latency is None:
            raise ValueError(f"scenario {scenario!r} carries no latency model: name one (--latency)")
        write_sysfs(fake, os.path.join(scratch, "sys"))
        settings = {"path.sysfs": os.path.join(scratch, "sys"), "path.procfs": os.path.join(scratch, "proc"),
                    "gpu.kmsg": False, "collector.gpu.detail": detail}
        install(fake)
        try:
            result = collector_cost(cycles, settings, interval, fake=fake)
        finally:
            fake.release()
            uninstall()
    links = len(fake.gpus[0].nvlink_up) if fake.gpus else 0
    return {**result, "scenario": scenario, "latency": fake.latency.name, "nvlinks_per_gpu": links, "detail": detail}


def _scenario_file(scenario: str, scratch: str) -> str:
    """A scenario name or file, or a capture (``.tar.gz``), whose NVML scenario is then taken out of it."""
    if not scenario.endswith(".tar.gz"):
        return scenario
    import tarfile

    with tarfile.open(scenario, "r:gz") as tar:
        member = tar.extractfile("fleetscope-capture/nvml.yaml")
        if member is None:
            raise ValueError(f"{scenario}: the capture holds no NVML scenario")
        path = os.path.join(scratch, "nvml.yaml")
        with open(path, "wb") as handle:
            handle.write(member.read())
    return path


def predicted_nvml_ms(real: dict[str, Any], latency: str) -> float:
    """What the latency model books for the call mix a real run made: its calls per cycle, and its fields per
    cycle by id, answered or refused (a run recorded before fields were counted by id: each charged the model's
    figure for a field without one of its own)."""
    from fleetscope_sim.nvml_fake import LatencyModel

    model = LatencyModel.named(latency)
    us = sum(entry["calls_per_cycle"] * model.call_us(name) for name, entry in real["by_symbol"].items())
    if "by_field" in real:
        us += sum(entry["answered_per_cycle"] * model.field_cost_us(int(field_id))
                  + entry["refused_per_cycle"] * model.field_cost_us(int(field_id), answered=False)
                  for field_id, entry in real["by_field"].items())
    else:
        us += real["fields_per_cycle"] * model.field_us
    return round(us / 1000, 3)


def field_split(result: dict[str, Any], latency: str) -> dict[str, float]:
    """A run's field values per cycle on the latency model, in ms, by what they read (energy, the throttle
    times, PCIe counters, NVLink, the rest), from its fields counted by id."""
    from fleetscope.sources.nvml_h import FIELDS_BY_ID
    from fleetscope_sim.nvml_fake import LatencyModel

    model = LatencyModel.named(latency)
    split: dict[str, float] = {}
    for field_id, entry in result.get("by_field", {}).items():
        known = FIELDS_BY_ID.get(int(field_id))
        value = (known.value or "nvlink") if known else "other"
        group = ("nvlink" if value.startswith("nvlink") else "pcie" if value.startswith("pcie")
                 else value if value in ("energy", "throttle_seconds") else "other")
        us = (entry["answered_per_cycle"] * model.field_cost_us(int(field_id))
              + entry["refused_per_cycle"] * model.field_cost_us(int(field_id), answered=False))
        split[group] = split.get(group, 0.0) + us / 1000
    return {group: round(ms, 3) for group, ms in split.items()}


def markdown(results: list[dict[str, Any]]) -> list[str]:
    rows = ["| run | GPUs | NVLinks per GPU | detail | per cycle: median (p95) | per GPU per cycle: median, mean "
            "| inside NVML per cycle | NVML calls per cycle | fields per cycle | first cycle |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        name = r.get("label") or f"{r['on']}, {r.get('scenario', 'this node')}"
        rows.append(
            f"| {name} | {r['gpus']} | {r.get('nvlinks_per_gpu', '-')} | {r.get('detail', 'default')} | "
            f"{r['ms_median']} ms ({r['ms_p95']} ms) | {r['ms_per_gpu_median']} ms, {r['ms_per_gpu_mean']} ms | "
            f"{r['nvml_ms_per_cycle']} ms | {r['nvml_calls_per_cycle']:.1f} | {r['fields_per_cycle']:.1f} | "
            f"{r['first_cycle_ms']} ms, {r['first_cycle_calls']} calls |")
    return rows


# What docs/benchmarks.md reports: a p5's 8 H100s with NVLink at both detail levels, a p4d's A100s (no GPM,
# 12 links) and the real H100's single GPU as captured, all on the H100 model.
REPORT_RUNS: tuple[tuple[str, str, str], ...] = (
    ("p5: 8 H100s, 18 NVLinks each", DEFAULT_SCENARIO, "default"),
    ("p5: 8 H100s, 18 NVLinks each", DEFAULT_SCENARIO, "all"),
    ("p4d: 8 A100s, 12 NVLinks each, no GPM", "a100_8x", "default"),
)
H100_CAPTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "tests", "fixtures", "captures", "h100_real.tar.gz")
LATENCY_MODEL = "h100_sxm_580"
# Sessions on a real GPU (scripts/h100-session) leave their cost figures here, to be reported beside the model.
REAL_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "real_h100_cost.json")


def measure_for_report(cycles: int = 60) -> list[dict[str, Any]]:
    """Every :data:`REPORT_RUNS` run on the H100 model, and the captured real H100 when the checkout has it."""
    runs = [{**model_cost(scenario, LATENCY_MODEL, cycles, detail=detail), "label": label}
            for label, scenario, detail in REPORT_RUNS]
    if os.path.exists(H100_CAPTURE):
        runs.append({**model_cost(H100_CAPTURE, LATENCY_MODEL, cycles),
                     "label": "1 H100 in a VM, no NVLink (the h100_real capture)"})
    return runs


def real_results() -> dict[str, Any] | None:
    """The last real-GPU session's cost figures (``cost.json`` of scripts/h100-session), when committed."""
    if not os.path.exists(REAL_RESULTS):
        return None
    with open(REAL_RESULTS, encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.gpu_cost", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scenario", default=DEFAULT_SCENARIO, help="NVML fake scenario (name or path).")
    parser.add_argument("--latency", default=None, help="Latency model in place of the scenario's own.")
    parser.add_argument("--cycles", type=int, default=60, help="Cycles after the first (default 60: 10 minutes).")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, help="Seconds per cycle (default 10).")
    parser.add_argument("--detail", choices=("default", "all"), default="default")
    parser.add_argument("--json", action="store_true", help="Print the full result as JSON.")
    args = parser.parse_args(argv)
    result = model_cost(args.scenario, args.latency, args.cycles, args.interval, args.detail)
    print(json.dumps(result, indent=1) if args.json else "\n".join(markdown([result])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
