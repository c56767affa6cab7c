"""One real GPU node, measured and captured: what ``scripts/h100-session`` runs on the GPU machine (#19 part 2).

    python3 -m benchmarks.real_gpu --out DIR [--idle-seconds 20] [--load-seconds 60] [--cycles 30]

Steps, each recorded even when another fails (a session on borrowed hardware must not lose the rest):

1. ``nvidia-smi -q`` and the driver's kernel-log lines (``NVRM``, GPU identities redacted);
2. ``fleetscope serve`` on the real NVML, scraped every 2 s while idle, and ``fleetscope check``;
3. a bf16 matrix-product loop in PyTorch on the GPU for ``--load-seconds``, scraped and checked again,
   and captured (``fleetscope capture``) idle and under load: ``h100_real_idle``, ``h100_real``;
4. the GPU collector's cost per cycle on the real NVML: wall time, and NVML calls and the time spent
   inside them, counted at the native-library boundary (as the NVML fake counts them in the tests).

``results.json`` holds every reading; ``report.md`` turns them into the field table (each GPU metric:
supported, unit, idle and load values, a plausibility verdict), the throttle reasons seen, the
collector's cost, and the differences between the captured NVML scenario and ``h100_8x_healthy``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

HOST = "127.0.0.1"
LOAD_SCRIPT = """
import json, sys, time
import torch
seconds = float(sys.argv[1])
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
start = time.time()
products = 0
while time.time() - start < seconds:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    products += 20
elapsed = time.time() - start
print(json.dumps({"device": torch.cuda.get_device_name(0), "seconds": elapsed, "products": products,
                  "tflops": 2 * n ** 3 * products / elapsed / 1e12}))
"""


# -- NVML calls, counted at the native-library boundary ----------------------------------------------


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
        try:
            return self._function(*args)
        finally:
            self._counter.record(self._name, time.perf_counter() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._function, name, value)  # pynvml sets restype on some functions


class NativeCallCounter:
    """Stands in for ``pynvml.nvmlLib`` (the real CDLL or the fake) and counts the calls one thread makes."""

    def __init__(self, library: Any) -> None:
        self.library = library
        self.thread = threading.get_ident()
        self.calls: dict[str, list[float]] = {}  # symbol -> [calls, seconds]

    def __getattr__(self, name: str) -> Any:
        return _Counted(name, getattr(self.library, name), self)

    def record(self, name: str, seconds: float) -> None:
        spent = self.calls.setdefault(name, [0, 0.0])
        spent[0] += 1
        spent[1] += seconds

    @classmethod
    @contextlib.contextmanager
    def installed(cls) -> Iterator[NativeCallCounter]:
        import pynvml  # type: ignore[import-untyped]

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


def collector_cost(cycles: int, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The GPU collector's cost per cycle after its first (which opens NVML and reads identities)."""
    from fleetscope.collectors.gpu import GpuCollector
    from fleetscope.config import load

    collector = GpuCollector(load(settings or {}, environ={}))
    try:
        collector.collect()
        durations: list[float] = []
        with NativeCallCounter.installed() as counter:
            for _ in range(cycles):
                started = time.perf_counter()
                collector.collect()
                durations.append(time.perf_counter() - started)
    finally:
        collector.close()
    calls = sum(int(c) for c, _ in counter.calls.values())
    inside = sum(s for _, s in counter.calls.values())
    ordered = sorted(durations)
    return {
        "cycles": cycles,
        "ms_median": round(statistics.median(durations) * 1000, 3),
        "ms_p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000, 3),
        "ms_max": round(ordered[-1] * 1000, 3),
        "nvml_calls_per_cycle": calls / cycles,
        "nvml_ms_per_cycle": round(inside / cycles * 1000, 3),
        "by_symbol": {name: {"calls_per_cycle": c / cycles, "us_per_call": round(s / c * 1e6, 1)}
                      for name, (c, s) in sorted(counter.calls.items(), key=lambda kv: -kv[1][1])},
    }


# -- the daemon as a user runs it --------------------------------------------------------------------


def _fleetscope(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetscope", *args]


def _get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return int(response.status), response.read().decode()


def parse_gpu_samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every ``fleetscope_gpu_*`` sample of one scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("fleetscope_gpu_"):
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k != "uuid")
                out[f"{sample.name}{{{labels}}}"] = float(sample.value)
    return out


@dataclass
class Session:
    out: str
    port: int
    results: dict[str, Any] = field(default_factory=dict)

    def step(self, name: str, action: Callable[[], Any]) -> Any:
        started = time.time()
        try:
            value = action()
            self.results[name] = {"ok": True, "seconds": round(time.time() - started, 1), "value": value}
        except Exception as exc:  # record and go on: the other steps still run
            self.results[name] = {"ok": False, "seconds": round(time.time() - started, 1),
                                  "error": f"{type(exc).__name__}: {exc}"}
            value = None
        self.save()
        return value

    def save(self) -> None:
        with open(os.path.join(self.out, "results.json"), "w", encoding="utf-8") as handle:
            json.dump(self.results, handle, indent=1, sort_keys=True, default=str)

    def scrapes(self, seconds: float, every: float = 2.0) -> list[dict[str, float]]:
        taken: list[dict[str, float]] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            status, text = _get(f"http://{HOST}:{self.port}/metrics")
            if status == 200:
                taken.append(parse_gpu_samples(text))
            time.sleep(every)
        return taken

    def check(self) -> dict[str, Any]:
        done = subprocess.run(_fleetscope("check", "--no-collector.steps"), capture_output=True, text=True,
                              timeout=120, check=False)
        return {"exit": done.returncode, "stdout": done.stdout[-4000:], "stderr": done.stderr[-2000:]}

    def capture(self, name: str) -> dict[str, Any]:
        path = os.path.join(self.out, f"{name}.tar.gz")
        done = subprocess.run(_fleetscope("capture", "--no-collector.steps", "-o", path), capture_output=True,
                              text=True, timeout=180, check=False)
        return {"exit": done.returncode, "stdout": done.stdout[-4000:], "stderr": done.stderr[-2000:],
                "bytes": os.path.getsize(path) if os.path.exists(path) else 0}


def kernel_log_lines(path: str = "/dev/kmsg") -> dict[str, Any]:
    from fleetscope.capture.files import read_kernel_log
    from fleetscope.capture.redact import Redactor

    log = read_kernel_log(path)
    redactor = Redactor()
    lines = [redactor.text(line) for line in log.records if "(not captured)" not in line]
    return {"readable": not log.error, "error": log.error, "records_read": log.total, "nvrm_lines": lines}


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.makedirs(args.out, exist_ok=True)
    session = Session(args.out, args.port)
    session.results["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    session.results["python"] = sys.version.split()[0]

    def smi() -> str:
        text = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=60, check=False).stdout
        with open(os.path.join(args.out, "nvidia-smi.txt"), "w", encoding="utf-8") as handle:
            handle.write(text)
        return "\n".join(line.strip() for line in text.splitlines()
                         if any(k in line for k in ("Driver Version", "CUDA Version", "Product Name", "VBIOS")))

    session.step("nvidia_smi", smi)
    kmsg = session.step("kernel_log", kernel_log_lines)
    if kmsg:
        with open(os.path.join(args.out, "kmsg-nvrm.txt"), "w", encoding="utf-8") as handle:
            handle.write("\n".join(kmsg["nvrm_lines"]) + "\n")
    log = open(os.path.join(args.out, "serve.log"), "wb")  # noqa: SIM115 - closed after the daemon stops
    serve = subprocess.Popen(_fleetscope("serve", "--web.listen-address", f"{HOST}:{args.port}",
                                         "--collector.gpu.interval", "2", "--no-collector.steps"),
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        session.step("serve_ready", lambda: _wait_ready(args.port, serve))
        session.step("idle_scrapes", lambda: session.scrapes(args.idle_seconds))
        session.step("check_idle", session.check)
        session.step("capture_idle", lambda: session.capture("h100_real_idle"))
        load = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, str(args.load_seconds)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(min(10.0, args.load_seconds / 4))  # clocks, power and GPM settle
        scrape_for = max(4.0, args.load_seconds * 0.4)
        session.step("load_scrapes", lambda: session.scrapes(scrape_for))
        session.step("check_load", session.check)
        session.step("capture_load", lambda: session.capture("h100_real"))
        output, errors = load.communicate(timeout=args.load_seconds + 120)

        def load_result() -> Any:
            if load.returncode != 0:
                raise RuntimeError(f"the load exited with {load.returncode}: {errors.strip()[-1500:]}")
            return json.loads(output.strip().splitlines()[-1])

        session.step("load", load_result)
        session.step("after_load_scrapes", lambda: session.scrapes(6.0))
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=15)
        except subprocess.TimeoutExpired:
            serve.kill()
        log.close()
    session.step("collector_cost", lambda: collector_cost(args.cycles))
    session.results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    session.save()
    with open(os.path.join(args.out, "report.md"), "w", encoding="utf-8") as handle:
        handle.write(report(session.results, os.path.join(args.out, "h100_real.tar.gz")))
    return session.results


def _wait_ready(port: int, process: subprocess.Popen[bytes], timeout: float = 90.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"fleetscope serve exited with {process.returncode} (serve.log)")
        with contextlib.suppress(OSError):
            if _get(f"http://{HOST}:{port}/readyz", timeout=2)[0] == 200:
                return round(time.monotonic() - started, 2)
        time.sleep(0.5)
    raise TimeoutError("fleetscope serve not ready")


# -- the report --------------------------------------------------------------------------------------


def _value(results: dict[str, Any], step: str) -> Any:
    entry = results.get(step) or {}
    return entry.get("value") if entry.get("ok") else None


def _series(scrapes: list[dict[str, float]] | None) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for scrape in scrapes or []:
        for key, value in scrape.items():
            out.setdefault(key, []).append(value)
    return out


def plausibility(key: str, idle: list[float], load: list[float], all_samples: dict[str, list[float]]) -> str:
    """A verdict for one sample's idle and load values ('' when there is no rule for it)."""
    name = key.split("{", 1)[0]
    idle_v = statistics.median(idle) if idle else None
    load_v = statistics.median(load) if load else None

    def other(metric: str, **labels: str) -> float | None:
        for k, values in all_samples.items():
            if k.startswith(metric + "{") and all(f'{lk}="{lv}"' in k for lk, lv in labels.items()):
                return statistics.median(values)
        return None

    def verdict(ok: bool, expectation: str) -> str:
        return ("ok: " if ok else "IMPLAUSIBLE: ") + expectation

    if idle_v is None or load_v is None:
        return ""
    if name == "fleetscope_gpu_utilization_ratio":
        return verdict(load_v >= 0.9 and idle_v <= 0.2, "near 1 under load, near 0 idle")
    if name in ("fleetscope_gpu_sm_active_ratio", "fleetscope_gpu_tensor_active_ratio"):
        return verdict(load_v >= 0.3 > idle_v, "clearly up under a bf16 matmul loop, near 0 idle")
    if name in ("fleetscope_gpu_sm_occupancy_ratio", "fleetscope_gpu_dram_active_ratio",
                "fleetscope_gpu_memory_utilization_ratio"):
        return verdict(0 <= idle_v <= 1 and 0 <= load_v <= 1 and load_v >= idle_v, "a ratio in 0..1, up under load")
    if name == "fleetscope_gpu_power_watts":
        limit = other("fleetscope_gpu_power_limit_watts")
        return verdict(load_v > idle_v + 50 and (limit is None or load_v <= limit * 1.1),
                       "well above idle under load, within the limit")
    if name == "fleetscope_gpu_clock_hertz" and 'clock="sm"' in key:
        top = other("fleetscope_gpu_clock_max_hertz", clock="sm")
        return verdict(load_v >= 1.0e9 and (top is None or load_v <= top * 1.01), "above 1 GHz under load, below max")
    if name in ("fleetscope_gpu_temperature_celsius", "fleetscope_gpu_memory_temperature_celsius"):
        return verdict(10 <= idle_v <= 95 and 10 <= load_v <= 105, "10-95 °C")
    if name == "fleetscope_gpu_energy_joules_total":
        return verdict(max(load) > min(idle), "grows")
    if name == "fleetscope_gpu_memory_used_bytes":
        return verdict(load_v > idle_v, "more memory in use under load")
    if name in ("fleetscope_gpu_pcie_link_max_generation", "fleetscope_gpu_pcie_link_max_width"):
        return verdict(load_v >= (4 if "generation" in name else 8), "Gen4+ / x8+")
    return ""


def report(results: dict[str, Any], capture_path: str) -> str:
    from fleetscope.metrics import gpu as gpu_metrics

    idle = _series(_value(results, "idle_scrapes"))
    load = _series(_value(results, "load_scrapes"))
    samples = {**idle, **{k: idle.get(k, []) + v for k, v in load.items()}}
    lines = ["# Real H100: the GPU collector on real NVML", "",
             f"Run {results.get('started')} to {results.get('finished')}, Python {results.get('python')}.", ""]
    smi = _value(results, "nvidia_smi")
    if smi:
        lines += ["```", smi, "```", ""]
    load_run = _value(results, "load")
    if load_run:
        lines += [f"Load: bf16 8192³ matrix products on {load_run.get('device')} for "
                  f"{load_run.get('seconds', 0):.0f} s, {load_run.get('tflops', 0):.0f} TFLOP/s.", ""]
    lines += ["## Fields", "", "| metric | unit | samples | idle | load | verdict |", "|---|---|---|---|---|---|"]
    seen_names = {key.split("{", 1)[0] for key in samples}
    for table in gpu_metrics.TABLES:
        for spec in table:
            name = str(spec)
            if name not in seen_names:
                lines.append(f"| `{name}` | {spec.unit or '-'} | absent | | | not reported on this node |")
                continue
            for key in sorted(k for k in samples if k.split("{", 1)[0] == name):
                i, lo = idle.get(key, []), load.get(key, [])
                lines.append(f"| `{key}` | {spec.unit or '-'} | {len(i)}+{len(lo)} | "
                             f"{_fmt(i)} | {_fmt(lo)} | {plausibility(key, i, lo, samples)} |")
    throttles = sorted({k for k, v in samples.items() if k.startswith("fleetscope_gpu_throttle_active") and max(v) > 0})
    lines += ["", "Throttle reasons active at some scrape: " + (", ".join(f"`{t}`" for t in throttles) or "none"), ""]
    for step in ("check_idle", "check_load"):
        value = _value(results, step)
        if value:
            lines += [f"`fleetscope check` ({step.split('_')[1]}): exit {value['exit']}", "```",
                      value["stdout"].strip(), "```", ""]
    cost = _value(results, "collector_cost")
    if cost:
        lines += ["## GPU collector cost per cycle (real NVML)", "",
                  f"{cost['cycles']} cycles: median {cost['ms_median']} ms, p95 {cost['ms_p95']} ms, "
                  f"max {cost['ms_max']} ms; {cost['nvml_calls_per_cycle']:.0f} NVML calls per cycle, "
                  f"{cost['nvml_ms_per_cycle']} ms inside NVML.", "", "| entry point | calls/cycle | µs/call |",
                  "|---|---|---|"]
        lines += [f"| `{n}` | {v['calls_per_cycle']:.0f} | {v['us_per_call']} |" for n, v in cost["by_symbol"].items()]
        lines.append("")
    kmsg = _value(results, "kernel_log")
    if kmsg:
        lines += ["## Kernel log", "", f"readable: {kmsg['readable']} {kmsg['error']}", "```",
                  *kmsg["nvrm_lines"][:40], "```", ""]
    lines += ["## Captured NVML scenario against h100_8x_healthy", "", *scenario_differences(capture_path)]
    failed = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and v.get("ok") is False}
    if failed:
        lines += ["", "## Steps that failed", ""] + [f"* {k}: {v}" for k, v in failed.items()]
    return "\n".join(lines) + "\n"


def _fmt(values: list[float]) -> str:
    if not values:
        return ""
    value = statistics.median(values)
    return f"{value:.4g}"


def scenario_differences(capture_path: str) -> list[str]:
    """GPU 0 of the shipped H100 scenario against GPU 0 of the captured one, as the fake would answer
    (a value, or the return code in its place; NOT_SUPPORTED however it was written)."""
    import dataclasses
    import tarfile
    import tempfile

    from fleetscope_sim.nvml_fake import FakeNvml, load_scenario
    from fleetscope_sim.nvml_fake.library import NOT_SUPPORTED

    if not os.path.exists(capture_path):
        return ["(no capture)"]
    with tarfile.open(capture_path, "r:gz") as tar, tempfile.TemporaryDirectory() as scratch:
        member = tar.extractfile("fleetscope-capture/nvml.yaml")
        if member is None:
            return ["(the capture has no nvml.yaml)"]
        path = os.path.join(scratch, "nvml.yaml")
        with open(path, "wb") as handle:
            handle.write(member.read())
        captured = load_scenario(path)
    shipped = load_scenario("h100_8x_healthy")

    def answers(fake: FakeNvml) -> dict[str, Any]:
        if not fake.gpus:
            return {}
        values = {f.name: getattr(fake.gpus[0], f.name) for f in dataclasses.fields(fake.gpus[0])}
        return {k: NOT_SUPPORTED if v is None else v for k, v in values.items()}

    mine, theirs = answers(captured), answers(shipped)
    rows = ["| field | h100_8x_healthy | captured |", "|---|---|---|"]
    for key in sorted(set(mine) | set(theirs)):
        if key in ("uuid", "serial", "processes", "index", "pci_bus") or mine.get(key) == theirs.get(key):
            continue
        rows.append(f"| `{key}` | {theirs.get(key, '')} | {mine.get(key, '')} |")
    rows += [f"| `{key}` | {getattr(shipped, key)} | {getattr(captured, key)} |"
             for key in ("driver_version", "nvml_version", "missing_functions", "init_error")
             if getattr(captured, key) != getattr(shipped, key)]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.real_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "h100"))
    parser.add_argument("--port", type=int, default=9402)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--load-seconds", type=float, default=60.0)
    parser.add_argument("--cycles", type=int, default=30)
    args = parser.parse_args(argv)
    results = run(args)
    failed = [k for k, v in results.items() if isinstance(v, dict) and v.get("ok") is False]
    print(f"{args.out}: results.json, report.md; failed steps: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
