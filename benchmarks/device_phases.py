"""#26's reference case on one real GPU: the step phases fleetscope reports beside the GPU's real idle time.

    python3 benchmarks/device_phases.py --out DIR              # on a machine with one NVIDIA GPU, < 90 s
    python3 benchmarks/device_phases.py --out DIR --device cpu --width 64 --layers 2 --batch 32 --steps 12

It starts a one-process DDP job under torchrun (``python3 -m torch.distributed.run --standalone
--nproc-per-node 1``, NCCL on the GPU, gloo on the CPU): 8 x Linear(8192) in bf16, batch 4,096, about
22 ms of GPU work per step on an H100, instrumented with the README's three lines (``StepTracker()``,
``tracker.watch(DDP(model))``, ``for batch in tracker.steps(loader)``). In that one process, two runs, each
with a fresh model and tracker:

* ``no_stall``: the loader answers at once;
* ``stall``: ``Dataset.__getitem__`` sleeps 30 ms (``--stall-ms``).

The loader is ``DataLoader(dataset, batch_size=None, num_workers=0)``, as in the original report: each item
is one whole batch, a pinned bf16 [4096, 8192] tensor that the step copies to the GPU (``non_blocking``).
The tracker pushes to a small receiver in the same process (the client's real wire, no daemon needed), so
the records are exactly what a daemon would store.

Per run, over the measured steps (after ``--warmup``), the report gives per step: the host's loader time
(``fetch_seconds``, and the dataset's own timing of ``__getitem__``), the device's data, compute and comm
and its step time as the tracker reports them, the host's wall time per step (from consecutive step
completions), and two independent measures of the GPU's real idle time per step:

* **CUPTI**: the last ``--profile-steps`` steps run under ``torch.profiler`` (CUDA activity only); the
  kernels and copies in its trace, merged, give the device's busy time, and the gaps between them its idle
  time. The tracker's data over the same steps is compared with it.
* **wall - busy**: the host's wall time per step less the GPU's busy time per step measured by CUPTI in the
  ``no_stall`` run (where nothing starves the GPU).

``results.json`` holds every record and figure, ``report.md`` the tables and the verdict of #26's check (the
stalled run's data within 10% of the GPU's idle time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CASES = ("no_stall", "stall")
RESULTS = "results.json"
REPORT = "report.md"
RANK_FILE = "rank0.json"


# -- the rank (under torchrun) --------------------------------------------------------------------------------


class Receiver:
    """A stand-in for the daemon's push route: stores every step the tracker reports, by job."""

    def __init__(self) -> None:
        self.steps: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's spelling
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    report = json.loads(body)
                    with receiver.lock:
                        receiver.steps.setdefault(report["job"], []).extend(report.get("steps", []))
                    self.send_response(200)
                except (ValueError, KeyError, TypeError):
                    self.send_response(400)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def run_case(args: argparse.Namespace, case: str, stall: float, device: Any) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from fleetscope.client import StepTracker

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    total = args.warmup + args.steps + args.profile_steps

    class SleepyBatches(torch.utils.data.Dataset[torch.Tensor]):
        """One whole batch per item, after ``stall`` seconds (a slow shard, decoding, a remote read)."""

        def __init__(self) -> None:
            self.batch = torch.randn(args.batch, args.width, dtype=dtype)
            if cuda:
                self.batch = self.batch.pin_memory()
            self.seconds: list[float] = []

        def __len__(self) -> int:
            return total

        def __getitem__(self, index: int) -> torch.Tensor:
            begun = time.perf_counter()
            if stall:
                time.sleep(stall)
            self.seconds.append(time.perf_counter() - begun)
            return self.batch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(args.width, args.width, bias=False)
                                  for _ in range(args.layers))).to(device=device, dtype=dtype)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-6)
    dataset = SleepyBatches()
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0)

    os.environ["FLEETSCOPE_JOB"] = f"device-phases-{case}"
    tracker = StepTracker()  # the README's three lines
    model_ = tracker.watch(ddp)
    profile_from = args.warmup + args.steps
    last_measured = profile_from - 1
    profiler = None
    # The script's own measure, beside the tracker's: CUDA events around each step's work (read after the
    # loop), and the device's wall time over the measured steps between two synchronisations.
    work: list[tuple[Any, Any]] = []
    window: list[float] = []
    for index, batch in enumerate(tracker.steps(loader)):
        if cuda and index == args.warmup:
            torch.cuda.synchronize()  # the measured window opens on an idle device
            window.append(time.perf_counter())
        if index == profile_from and args.profile_steps and cuda:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            profiler.__enter__()
        started = torch.cuda.Event(enable_timing=True) if cuda else None
        if started is not None:
            started.record()
        x = batch.to(device, non_blocking=True)
        loss = model_(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if started is not None:
            ended = torch.cuda.Event(enable_timing=True)
            ended.record()
            work.append((started, ended))
        if cuda and index == last_measured:
            torch.cuda.synchronize()  # ... and closes when the device finished its last step's work
            window.append(time.perf_counter())
    if cuda:
        torch.cuda.synchronize()  # after the loop: every event complete, so the tracker flushes the device's view
    cupti = None
    if profiler is not None:
        profiler.__exit__(None, None, None)
        cupti = device_timeline(profiler)
    busy = [start.elapsed_time(end) / 1000.0 for start, end in work[args.warmup:profile_from]]
    measured = {"wall_per_step": (window[1] - window[0]) / args.steps if len(window) == 2 else None,
                "busy_per_step": statistics.fmean(busy) if busy else None}
    tracker.close(timeout=10)
    stats = tracker.stats()
    del ddp, model, optimizer, model_
    if cuda:
        torch.cuda.empty_cache()
    return {"tracker": {"sent": stats.sent, "dropped": stats.dropped, "rejected": stats.rejected,
                        "errors": tracker.errors},
            "getitem_seconds": dataset.seconds, "cupti": cupti, "profile_from_step": profile_from + 1,
            "measured": measured}


def device_timeline(profiler: Any) -> dict[str, Any]:
    """Busy and idle seconds of the device over the profiled steps, from CUPTI's kernel and copy records."""
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "trace.json")
        profiler.export_chrome_trace(path)
        with open(path) as trace:
            events = json.load(trace).get("traceEvents", [])
    intervals = sorted(
        (float(e["ts"]) / 1e6, (float(e["ts"]) + float(e.get("dur", 0))) / 1e6)
        for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    return merged_busy(intervals)


def merged_busy(intervals: list[tuple[float, float]]) -> dict[str, Any]:
    """The span from the first device operation to the last, the time covered by operations, and the gaps."""
    if not intervals:
        return {"span": 0.0, "busy": 0.0, "idle": 0.0, "operations": 0}
    busy, (start, end) = 0.0, intervals[0]
    first = start
    for begun, ended in intervals[1:]:
        if begun > end:
            busy += end - start
            start, end = begun, ended
        else:
            end = max(end, ended)
    busy += end - start
    span = end - first
    return {"span": span, "busy": busy, "idle": span - busy, "operations": len(intervals)}


def rank_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import fleetscope

    cuda = args.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    receiver = Receiver()
    os.environ["FLEETSCOPE_PUSH_URL"] = receiver.url
    results: dict[str, Any] = {
        "args": vars(args), "fleetscope": fleetscope.__file__, "torch": torch.__version__,
        "python": sys.version.split()[0],
        "gpu": torch.cuda.get_device_name(device) if cuda else None, "cases": {},
    }
    for case in CASES:
        stall = args.stall_ms / 1000.0 if case == "stall" else 0.0
        begun = time.perf_counter()
        results["cases"][case] = run_case(args, case, stall, device)
        results["cases"][case]["seconds"] = time.perf_counter() - begun
        results["cases"][case]["steps"] = receiver.steps.get(f"device-phases-{case}", [])
    receiver.close()
    dist.destroy_process_group()
    Path(args.out, RANK_FILE).write_text(json.dumps(results))
    return 0


# -- the driver: start the job, turn its records into the report ---------------------------------------------


def summarize(case: dict[str, Any], args: argparse.Namespace, no_stall_busy: float | None) -> dict[str, Any]:
    steps = sorted(case["steps"], key=lambda s: s["step"])
    first, last = args.warmup + 1, args.warmup + args.steps  # the measured window (1-based step numbers)
    window = [s for s in steps if first <= s["step"] <= last]
    per_step = {}
    for field in ("fetch_seconds", "data_seconds", "compute_seconds", "comm_seconds", "step_seconds"):
        values = [s[field] for s in window if field in s]
        per_step[field] = {"mean": statistics.fmean(values), "median": statistics.median(values)} if values else None
    measured = case.get("measured") or {}
    wall, busy = measured.get("wall_per_step"), measured.get("busy_per_step")
    if wall is None and len(window) > 1:  # no device to synchronise (the CPU): the host's step completions
        wall = (window[-1]["timestamp"] - window[0]["timestamp"]) / (len(window) - 1)
    getitem = case["getitem_seconds"][args.warmup:args.warmup + args.steps]
    summary: dict[str, Any] = {
        "steps_reported": len(steps), "measured_steps": len(window), "per_step": per_step,
        "wall_per_step": wall, "busy_per_step": busy,
        "getitem_per_step": statistics.fmean(getitem) if getitem else None,
        "idle_wall_minus_busy": wall - busy if wall is not None and busy is not None else None,
        "idle_wall_minus_no_stall_busy": (wall - no_stall_busy
                                          if wall is not None and no_stall_busy is not None else None),
    }
    cupti = case.get("cupti")
    if cupti and cupti["operations"]:
        profiled = [s for s in steps if s["step"] >= case["profile_from_step"]]
        gaps = max(1, len(profiled) - 1)  # the span holds every profiled step's work and the gaps between them
        data = [s["data_seconds"] for s in profiled[1:] if "data_seconds" in s]
        summary["cupti"] = {
            "steps": len(profiled), "busy_per_step": cupti["busy"] / max(1, len(profiled)),
            "idle_per_step": cupti["idle"] / gaps,
            "tracker_data_per_step": statistics.fmean(data) if data else None,
        }
    return summary


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.2f}"


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    summaries = results["summary"]
    lines = [
        "# Step phases on the device (#26 reference case)",
        "",
        f"{results.get('gpu') or 'CPU'}; torch {results['torch']}; Python {results['python']}; "
        f"fleetscope from `{results['fleetscope']}`.",
        f"One-process DDP ({'NCCL' if args.device == 'cuda' else 'gloo'}) under torchrun: {args.layers} x "
        f"Linear({args.width}) in {'bf16' if args.device == 'cuda' else 'fp32'}, batch {args.batch}; "
        f"`DataLoader(dataset, batch_size=None, num_workers=0)`, one pinned batch per item, copied with "
        f"`non_blocking=True`; stall {args.stall_ms:g} ms in `Dataset.__getitem__`. "
        f"{args.steps} measured steps after {args.warmup} warm-up steps; {args.profile_steps} more under CUPTI.",
        "",
        "Per step, milliseconds (means over the measured steps; medians in results.json):",
        "",
        "| run | host loader (`fetch`) | `__getitem__` | device data | compute | comm | step (device) | "
        "wall per step | GPU busy per step | GPU idle: wall - busy | GPU idle: CUPTI | tracker data, same steps |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in CASES:
        s = summaries[case]
        p = s["per_step"]

        def mean(field: str, p: dict[str, Any] = p) -> float | None:
            return p[field]["mean"] if p.get(field) else None

        cupti = s.get("cupti") or {}
        lines.append(
            f"| {case} | {ms(mean('fetch_seconds'))} | {ms(s['getitem_per_step'])} | {ms(mean('data_seconds'))} | "
            f"{ms(mean('compute_seconds'))} | {ms(mean('comm_seconds'))} | {ms(mean('step_seconds'))} | "
            f"{ms(s['wall_per_step'])} | {ms(s['busy_per_step'])} | {ms(s['idle_wall_minus_busy'])} | "
            f"{ms(cupti.get('idle_per_step'))} | {ms(cupti.get('tracker_data_per_step'))} |")
    lines += [
        "",
        "Wall per step: the device's, between two synchronisations around the measured steps (on the CPU, the "
        "host's step completions). GPU busy per step: the script's own CUDA events around each step's work. "
        "CUPTI: the kernels and copies of the last profiled steps (after the measured ones), merged; the "
        "tracker's data over those same steps beside it.",
    ]
    lines += ["", "## The check", ""]
    verdicts = results["verdicts"]
    for name, verdict in verdicts.items():
        lines.append(f"- {name}: {verdict}")
    lines.append("")
    return "\n".join(lines)


def verdicts(results: dict[str, Any]) -> dict[str, str]:
    """#26's check: the stalled run's data within 10% of the GPU's real idle time, by each independent measure."""
    stall = results["summary"]["stall"]
    out = {}

    def compare(data: float, idle: float) -> str:
        error = (data - idle) / idle
        return f"{ms(data)} ms vs {ms(idle)} ms ({error:+.1%}): {'PASS' if abs(error) <= 0.10 else 'FAIL'}"

    cupti = stall.get("cupti")
    if cupti and cupti.get("tracker_data_per_step") is not None and cupti["idle_per_step"] > 0:
        out["tracker data vs CUPTI idle, same steps"] = compare(cupti["tracker_data_per_step"], cupti["idle_per_step"])
    data = stall["per_step"]["data_seconds"]
    if data and stall["idle_wall_minus_busy"]:
        out["tracker data vs wall - busy (the script's events), measured steps"] = compare(
            data["mean"], stall["idle_wall_minus_busy"])
    if data and stall["idle_wall_minus_no_stall_busy"]:
        out["for reference: wall - the no-stall run's busy time (a GPU busy 40% of the time runs faster)"] = (
            f"{ms(stall['idle_wall_minus_no_stall_busy'])} ms")
    fetch = stall["per_step"]["fetch_seconds"]
    if fetch and data:
        out["the two views"] = f"the loader took {ms(fetch['mean'])} ms; the device waited {ms(data['mean'])} ms"
    return out


def torchrun_command(argv: list[str]) -> list[str]:
    """The one-process job: this file again, as torchrun's worker."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
            os.path.abspath(__file__), "--rank-run", *argv]


def torchrun(args: argparse.Namespace, argv: list[str]) -> bool:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    result = subprocess.run(torchrun_command(argv), env=env, capture_output=True, text=True, timeout=args.timeout,
                            check=False)
    Path(args.out, "torchrun.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        print(result.stdout[-3000:] + result.stderr[-3000:], file=sys.stderr)
    return result.returncode == 0


def driver(args: argparse.Namespace, argv: list[str], launch: Any = torchrun) -> int:
    """Run the job (``launch``: torchrun; a test runs the rank in its own process), then write the report."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    begun = time.perf_counter()
    if not launch(args, argv) or not (out / RANK_FILE).exists():
        print(f"device_phases: the job failed; see {out / 'torchrun.log'}", file=sys.stderr)
        return 1
    results = json.loads((out / RANK_FILE).read_text())
    results["seconds"] = time.perf_counter() - begun
    no_stall = summarize(results["cases"]["no_stall"], args, None)
    no_stall_busy = no_stall["busy_per_step"] if no_stall["busy_per_step"] is not None else no_stall["wall_per_step"]
    results["summary"] = {case: summarize(results["cases"][case], args, no_stall_busy) for case in CASES}
    results["verdicts"] = verdicts(results)
    (out / RESULTS).write_text(json.dumps(results, indent=1))
    text = report(results, args) + f"\nWhole run: {results['seconds']:.1f} s.\n"
    (out / REPORT).write_text(text)
    (out / RANK_FILE).unlink()
    print(text)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="device_phases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for results.json and report.md")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=120, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--profile-steps", type=int, default=30, help="steps after the measured ones under CUPTI")
    parser.add_argument("--stall-ms", type=float, default=30.0)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--timeout", type=float, default=240.0, help="the job's limit, seconds")
    parser.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    return rank_main(args) if args.rank_run else driver(args, argv)


if __name__ == "__main__":
    sys.exit(main())
