"""Real torch jobs with slightly slower ranks and healthy ones, replayed through the production rules (#39 item 2).

The recording (:mod:`tests.e2e.straggler_record`: real gloo DDP jobs, the client's real reports, real daemons,
a real Prometheus scraping every 15 s on a busy shared machine) is kept compact in
``tests/fixtures/recorded/stragglers-*.json.gz`` (one a recording): the training series Prometheus scraped, each
sample's value and its scrape's time. Here it becomes promtool input on a 15 s grid
(:func:`tests.e2e.production_record.grid_series`), evaluated every minute: the straggler records' own interval
(``straggler_sample_window``), so their samples do not overlap, as in Prometheus (promtool evaluates every group
at the test's one interval).

    python -m tests.alerts.recorded_stragglers compact --raw /tmp/stragglers.json.gz --out stragglers-2.json.gz
    python -m tests.alerts.recorded_stragglers measure                                 # the detection table
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from fleetscope_sim.virtual import promtool_test_rules
from tests.alerts.rulefiles import group_order
from tests.e2e.production_record import encode, grid_series

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "recorded"
RULES = ROOT / "alerts" / "fleetscope.rules.yml"
SCRAPE = 15.0
EVALUATION = "1m"  # Settings.straggler_sample_window: the straggler records' interval
SLOW_RANK = "2"


def fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("stragglers-*.json.gz"))


def compact(raw_path: str, out: Path, drop: tuple[str, ...] = ()) -> None:
    """The recording without what a replay does not read: values to 6 significant digits, times to 1 ms; the
    jobs in ``drop`` left out (a job the recording cut short)."""
    with gzip.open(raw_path, "rt", encoding="utf-8") as handle:
        raw = json.load(handle)
    series = []
    for s in raw["series"]:
        if s["metric"].get("training_job") in drop:
            continue
        stamp = s["metric"]["__name__"].endswith("_timestamp_seconds")
        values = [[round(float(t), 3), f"{float(v):.3f}" if stamp else f"{float(v):.6g}"] for t, v in s["values"]]
        series.append({"metric": s["metric"], "values": values})
    kept = {k: raw[k] for k in ("started", "ended", "scrape_seconds", "device_ms", "slow_rank") if k in raw}
    kept["jobs"] = [job for job in raw["jobs"] if job["name"] not in drop]
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as handle:
        json.dump({**kept, "series": series}, handle, separators=(",", ":"))


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)  # type: ignore[no-any-return]


def job_starts(raw: dict[str, Any]) -> tuple[dict[str, float], dict[str, float], float]:
    """Per job, the first and the last scrape that saw its steps grow, in seconds on the test's clock."""
    series, _ = grid_series(raw)
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for key, values in series.items():
        found = re.search(r'training_job="([^"]+)"', key)
        if not key.startswith("fleetscope_training_steps_total") or not found:
            continue
        numbers = [(i, v) for i, v in enumerate(values) if isinstance(v, float)]
        stepped = [i for (i, v), (_, before) in zip(numbers[1:], numbers, strict=False) if v > before]
        if stepped:
            job = found.group(1)
            starts[job] = min(starts.get(job, 1e18), stepped[0] * SCRAPE)
            ends[job] = max(ends.get(job, 0.0), stepped[-1] * SCRAPE)
    length = len(next(iter(series.values())))
    return starts, ends, (length - 1) * SCRAPE


def input_series(raw: dict[str, Any]) -> list[dict[str, str]]:
    series, _ = grid_series(raw)
    return [{"series": key, "values": encode(values)} for key, values in sorted(series.items())]


def promtool_document(raw: dict[str, Any], checks: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return {
        "rule_files": [str(RULES)],
        "evaluation_interval": EVALUATION,
        "group_eval_order": group_order(),
        "tests": [{"name": name, "interval": f"{SCRAPE:.0f}s", "input_series": input_series(raw),
                   "promql_expr_test": checks}],
    }


def run(document: dict[str, Any], directory: Path) -> subprocess.CompletedProcess[str]:
    path = directory / "recorded-stragglers.test.yml"
    path.write_text(yaml.safe_dump(document, width=1_000_000, sort_keys=False), encoding="utf-8")
    return promtool_test_rules(path, timeout=900)


def first_active(raw: dict[str, Any]) -> dict[tuple[str, str, str, str], float]:
    """(alertname, alertstate, training_job, rank) -> the first evaluation it was seen, on the test's clock. The
    check fails on purpose: promtool prints what the query returned."""
    _, _, end = job_starts(raw)
    expr = f"min_over_time(timestamp(ALERTS)[{end:.0f}s:{EVALUATION}])"
    document = promtool_document(raw, [{"expr": expr, "eval_time": f"{end:.0f}s", "exp_samples": []}], "measure")
    with tempfile.TemporaryDirectory() as directory:
        result = run(document, Path(directory))
    found: dict[tuple[str, str, str, str], float] = {}
    for match in re.finditer(r"\{([^}]*)\} ([0-9.E+-]+)", result.stdout + result.stderr):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if "alertname" in labels:
            key = (labels["alertname"], labels.get("alertstate", ""), labels.get("training_job", ""),
                   labels.get("rank", ""))
            found[key] = min(found.get(key, 1e18), float(match.group(2)))
    return found


def measure() -> int:
    print("| recording | job | slower rank's accelerator | ran (min) | slow rank named (firing) after | other alerts |")
    print("|---|---|---|---|---|---|")
    for path in fixtures():
        measure_one(path)
    return 0


def measure_one(path: Path) -> None:
    raw = load(path)
    starts, ends, _ = job_starts(raw)
    seen = first_active(raw)
    slowdowns = {j["name"]: j["slowdown"] for j in raw["jobs"]}
    for job, start in sorted(starts.items(), key=lambda kv: (slowdowns.get(kv[0], 0.0), kv[0])):
        named = seen.get(("TrainingStragglerRank", "firing", job, SLOW_RANK))
        named_text = f"{(named - start) / 60:.1f} min" if named is not None else "not named"
        if named is not None and named > ends[job]:
            named_text += " (after the end)"
        others = sorted(
            f"{a}/{state}/rank {r or '-'} at {(t - start) / 60:.1f} min" for (a, state, j, r), t in seen.items()
            if j == job and not (a == "TrainingStragglerRank" and r == SLOW_RANK and slowdowns[job] > 0)
        )
        print(f"| {path.name} | {job} | +{slowdowns.get(job, 0.0):.0%} | {(ends[job] - start) / 60:.1f} | "
              f"{named_text} | {'; '.join(others) or 'none'} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    com = sub.add_parser("compact")
    com.add_argument("--raw", required=True)
    com.add_argument("--out", required=True, help="file name under tests/fixtures/recorded/")
    com.add_argument("--drop", default="", help="jobs to leave out, comma-separated")
    sub.add_parser("measure")
    args = parser.parse_args()
    if args.command == "compact":
        compact(args.raw, FIXTURES / args.out, tuple(j for j in args.drop.split(",") if j))
        return 0
    return measure()


if __name__ == "__main__":
    sys.exit(main())
