"""One real GPU node, measured and captured: what ``scripts/h100-session`` runs on the GPU machine (#19, #25).

    python3 -m benchmarks.real_gpu --out DIR [--idle-seconds 20] [--load-seconds 60] [--cycles 60]

Steps, each recorded even when another fails (a session on borrowed hardware must not lose the rest):

1. ``nvidia-smi -q`` and the driver's kernel-log lines (``NVRM``, GPU identities redacted);
2. the GPU collector's cost per cycle on the real NVML, idle (wall time, NVML calls, fields and the time
   spent inside them, counted at the native-library boundary as the NVML fake counts them in the tests),
   and each field value asked alone;
3. ``fleetscope serve`` on the real NVML, scraped every 2 s while idle, and ``fleetscope check``;
4. a bf16 matrix-product loop in PyTorch on the GPU for ``--load-seconds``, scraped and checked again,
   captured (``fleetscope capture``) idle and under load (``h100_real_idle``, ``h100_real``), and the
   collector's and the fields' cost measured again under load;
5. the same cost on the NVML fake's H100 latency model (``benchmarks.gpu_cost``): this node as captured,
   and a p5's 8 GPUs with NVLink.

``results.json`` holds every reading; ``report.md`` turns them into the field table (each GPU metric:
supported, unit, idle and load values, a plausibility verdict), the throttle reasons seen, the
collector's cost real and modelled, each field's cost, and the differences between the captured NVML
scenario and ``h100_8x_healthy``.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.gpu_cost import collector_cost, markdown, model_cost, predicted_nvml_ms
from fleetscope_sim.harness import Daemon

HOST = "127.0.0.1"
LATENCY_MODEL = "h100_sxm_580"
COST_SETTINGS: dict[str, Any] = {}  # the collector as the daemon runs it by default (kernel log, job attribution)
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
print("running", flush=True)  # torch's import and CUDA's start take seconds: the session waits for this
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


def _wait_running(load: subprocess.Popen[str], timeout: float) -> float:
    """Seconds until the load's first products finished (its "running" line); an error if it died or hung first.

    A fixed sleep after the start scraped a load still importing torch (run2: 0 % busy, 75 W, 345 MHz).
    """
    started = time.monotonic()
    assert load.stdout is not None
    ready: list[str] = []
    reader = threading.Thread(target=lambda: ready.append(load.stdout.readline() if load.stdout else ""), daemon=True)
    reader.start()
    reader.join(timeout)
    if not ready or ready[0].strip() != "running":
        raise RuntimeError(f"the load did not start within {timeout:.0f} s (exit {load.poll()})")
    return time.monotonic() - started


# -- NVML's cost: the collector per cycle, each field value alone --------------------------------------

# Every field the reader asks, with the candidates it may ask (PCIe bytes, NVLink totals and per-link fields).
def _field_candidates() -> dict[int, str]:
    from fleetscope.sources import nvml_h

    out = {}
    for entry in nvml_h.FIELDS:
        labels = ",".join(entry.labels)
        out[entry.id] = (f"{entry.value or 'nvlink_links'}{'/' + labels if labels else ''}"
                         f"{' (link 0)' if entry.per_link else ''}")
    return out


def field_costs(repeats: int = 15) -> dict[str, Any]:
    """Each field value asked alone, ``repeats`` times (median µs, the answer, NVML's own ``latencyUsec``),
    then the reader's batches: why 21 fields cost 4.9 ms, and what a field costs that this node cannot show."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)

        def timed(ids: list[tuple[int, int]]) -> tuple[float, list[Any]]:
            spent = []
            values: list[Any] = []
            for _ in range(repeats):
                started = time.perf_counter()
                values = pynvml.nvmlDeviceGetFieldValues(handle, ids)
                spent.append(time.perf_counter() - started)
            return round(statistics.median(spent) * 1e6, 1), values

        alone = {}
        for field_id, what in sorted(_field_candidates().items()):
            us, values = timed([(field_id, 0)])
            item = values[0]
            alone[str(field_id)] = {"what": what, "us": us, "answer": pynvml.nvmlErrorString(item.nvmlReturn)
                                    if item.nvmlReturn else "ok", "nvml_latency_us": int(item.latencyUsec)}
        answered = [int(i) for i, v in alone.items() if v["answer"] == "ok"]
        batches = {}
        for name, ids in (("every candidate", [int(i) for i in alone]), ("those answered", answered),
                          ("the 21 of the report", [3, 4, 5, 6, 29, 30, 31, 82, 83, 94, 142, 143, 144, 145, 74, 76,
                                                    269, 270, 271, 230, 91])):
            us, _ = timed([(i, 0) for i in ids])
            batches[name] = {"fields": len(ids), "us": us}
        return {"repeats": repeats, "alone": alone, "batches": batches}
    finally:
        pynvml.nvmlShutdown()


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
    session = Session(args.out, 0)  # the daemon's port once it has bound one
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
    # NVML's cost first, on an idle GPU with nothing else calling NVML.
    session.step("cost_idle", lambda: collector_cost(args.cycles, COST_SETTINGS))
    session.step("fields_idle", field_costs)
    # ``fleetscope serve`` on port 0 through the shared harness: its log is serve.log, its address read back.
    serve = Daemon.serve(args.out, {"collector.gpu.interval": 2, "collector.steps": False}, name="serve")
    try:
        session.step("serve_ready", lambda: _serve_ready(serve, session))
        session.step("idle_scrapes", lambda: session.scrapes(args.idle_seconds))
        session.step("check_idle", session.check)
        session.step("capture_idle", lambda: session.capture("h100_real_idle"))
        load = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, str(args.load_seconds)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        session.step("load_started", lambda: _wait_running(load, timeout=120.0))
        time.sleep(min(10.0, args.load_seconds / 4))  # clocks, power and GPM settle
        scrape_for = max(4.0, args.load_seconds * 0.3)
        session.step("load_scrapes", lambda: session.scrapes(scrape_for))
        session.step("check_load", session.check)
        session.step("capture_load", lambda: session.capture("h100_real"))
        session.step("cost_load", lambda: collector_cost(args.cycles, COST_SETTINGS))
        session.step("fields_load", field_costs)
        output, errors = load.communicate(timeout=args.load_seconds + 120)

        def load_result() -> Any:
            if load.returncode != 0:
                raise RuntimeError(f"the load exited with {load.returncode}: {errors.strip()[-1500:]}")
            return json.loads(output.strip().splitlines()[-1])

        session.step("load", load_result)
        session.step("after_load_scrapes", lambda: session.scrapes(4.0))
    finally:
        serve.stop()
    # The latency model's figures beside the real ones: this node's GPU as captured, and a p5's 8 with NVLink.
    session.step("model_this_node", lambda: model_cost(
        os.path.join(args.out, "h100_real.tar.gz"), LATENCY_MODEL, args.cycles))
    session.step("model_p5", lambda: model_cost("h100_8x_healthy", LATENCY_MODEL, args.cycles))
    session.results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    session.save()
    with open(os.path.join(args.out, "cost.json"), "w", encoding="utf-8") as handle:
        json.dump(cost_figures(session.results), handle, indent=1, sort_keys=True)  # benchmarks/real_h100_cost.json
    with open(os.path.join(args.out, "report.md"), "w", encoding="utf-8") as handle:
        handle.write(report(session.results, os.path.join(args.out, "h100_real.tar.gz")))
    return session.results


def _serve_ready(serve: Daemon, session: Session, timeout: float = 90.0) -> float:
    """Seconds from the start to ``/readyz`` answering 200; the session scrapes the port it bound."""
    started = time.monotonic()
    serve.start(timeout)
    session.port = serve.port
    return round(time.monotonic() - started, 2)


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
    lines += cost_section(results)
    kmsg = _value(results, "kernel_log")
    if kmsg:
        lines += ["## Kernel log", "", f"readable: {kmsg['readable']} {kmsg['error']}", "```",
                  *kmsg["nvrm_lines"][:40], "```", ""]
    lines += ["## Captured NVML scenario against h100_8x_healthy", "", *scenario_differences(capture_path)]
    failed = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and v.get("ok") is False}
    if failed:
        lines += ["", "## Steps that failed", ""] + [f"* {k}: {v}" for k, v in failed.items()]
    return "\n".join(lines) + "\n"


COST_RUNS = (("cost_idle", "real NVML, idle"), ("cost_load", "real NVML, under load"),
             ("model_this_node", "latency model, this node as captured"),
             ("model_p5", "latency model, p5: 8 H100s with NVLink"))


def cost_figures(results: dict[str, Any]) -> dict[str, Any]:
    """The cost runs, labelled, with the GPU and the date: what docs/benchmarks.md shows beside the model."""
    smi = _value(results, "nvidia_smi") or ""
    device = ", ".join(line.split(":", 1)[1].strip() for line in smi.splitlines()
                       if line.startswith(("Product Name", "Driver Version")))
    runs = [{**_value(results, step), "label": label} for step, label in COST_RUNS if _value(results, step)]
    figures: dict[str, Any] = {"date": results.get("started", ""), "device": device, "runs": runs}
    # each field alone and the batches, idle and under load: where a field-value call's time goes
    fields = {name: _value(results, step) for name, step in (("idle", "fields_idle"), ("load", "fields_load"))}
    if any(fields.values()):
        figures["fields"] = {name: value for name, value in fields.items() if value}
    return figures


def cost_section(results: dict[str, Any]) -> list[str]:
    """The collector's cost per cycle, real NVML (idle, under load) beside the latency model, and each field."""
    runs = []
    for step, label in COST_RUNS:
        value = _value(results, step)
        if value:
            runs.append({**value, "label": label})
    if not runs:
        return []
    lines = ["## GPU collector cost per cycle", "",
             f"Cycles after the first on a clock stepped {runs[0]['interval_s']:.0f} s per cycle (slow reads and "
             "retries come due as in a daemon at its default interval). Real NVML: wall time. Latency model: "
             f"the collector's own CPU time plus the NVML time the fake books ({LATENCY_MODEL}).", "",
             *markdown(runs), ""]
    for run_ in runs:
        if run_["on"] != "real NVML":
            continue
        with contextlib.suppress(Exception):  # the model's prediction needs fleetscope_sim
            lines.append(f"* {run_['label']}: the latency model books {predicted_nvml_ms(run_, LATENCY_MODEL)} ms "
                         f"for this call mix; NVML took {run_['nvml_ms_per_cycle']} ms.")
    lines.append("")
    for run_ in runs:
        if run_["on"] != "real NVML":
            continue
        lines += [f"{run_['label']}:", "", "| entry point | calls/cycle | µs/call |", "|---|---|---|"]
        lines += [f"| `{n}` | {v['calls_per_cycle']:.2f} | {v['us_per_call']} |" for n, v in run_["by_symbol"].items()]
        lines.append("")
    idle, loaded = _value(results, "fields_idle"), _value(results, "fields_load")
    if idle:
        lines += ["## Field values, each asked alone", "",
                  f"`nvmlDeviceGetFieldValues` with one field, median of {idle['repeats']} calls, idle and under load; "
                  "NVML's own `latencyUsec` for the field beside it.", "",
                  "| field | reading | answer | µs idle | µs load | latencyUsec idle |", "|---|---|---|---|---|---|"]
        for field_id, entry in idle["alone"].items():
            under = (loaded or {}).get("alone", {}).get(field_id, {})
            lines.append(f"| {field_id} | {entry['what']} | {entry['answer']} | {entry['us']} | "
                         f"{under.get('us', '')} | {entry['nvml_latency_us']} |")
        lines += ["", "| batch | fields | µs idle | µs load |", "|---|---|---|---|"]
        for name, entry in idle["batches"].items():
            under = (loaded or {}).get("batches", {}).get(name, {})
            lines.append(f"| {name} | {entry['fields']} | {entry['us']} | {under.get('us', '')} |")
        lines.append("")
    return lines


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
        gpu = fake.gpus[0]  # as the fake answers: GPM's PCIe rates and the NVLink totals, given or derived
        values["gpm"] = gpu.gpm_metrics() or values["gpm"]
        values["nvlink_error_totals"] = {k: gpu.nvlink_total(k) for k in ("replay", "recovery", "crc_flit", "crc_data")}
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
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--load-seconds", type=float, default=60.0)
    parser.add_argument("--cycles", type=int, default=60, help="Collector cycles per cost run (10 s apart).")
    args = parser.parse_args(argv)
    results = run(args)
    failed = [k for k, v in results.items() if isinstance(v, dict) and v.get("ok") is False]
    print(f"{args.out}: results.json, report.md; failed steps: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
