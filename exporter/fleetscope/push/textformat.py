"""A pushed body in the Prometheus text format, parsed and checked: what ``prometheus_client.push_to_gateway``
sends. Pure: text and grouping key in, frozen dataclasses out, no settings and no state.

Grouping labels override labels of the same name in the body, and samples must not carry timestamps.
What is accepted matches Pushgateway 1.5.1 on the text format (tested side by side with the real
binary): untyped families, samples of one family spread over the body, HELP after samples,
case-insensitive types; a second HELP or TYPE line, a TYPE after the family's samples, a type outside
the text format's five, a non-float ``le`` or ``quantile`` or a repeated sample answer 400. Where the
Pushgateway accepts data that it then re-exposes in a form OpenMetrics parsers refuse (histogram
buckets out of order or without ``+Inf`` and ``_count``, a negative counter, a quantile outside
[0, 1], a ``le`` grouping label on a histogram, a family clashing with another's
``_total``/``_bucket``/... samples), this receiver answers 400 instead, so one push can never make the
node's whole scrape unparsable. Missing pieces that are the same quantity are filled in (a
histogram's ``+Inf`` bucket from its ``_count`` and back); nothing is invented. What spans groups (a
series another group already exposes) is the store's check (:mod:`fleetscope.push.groups`).

Parsing and validation are linear in the body and run before the store's lock is taken; a body
with more sample lines than a group may hold is refused before it is parsed.

This module parses with ``prometheus_client.parser`` (the text format's reference parser), adds the
checks the Go parser makes and it does not, and returns plain frozen dataclasses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from fleetscope.compat import parse_text_format
from fleetscope.metrics.spec import NAMESPACE
from fleetscope.push.grouping import EXPOSED_LABEL, GroupError, GroupKey, ReservedName, check_label

Labels = tuple[tuple[str, str], ...]

TEXT_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
# A "# HELP name ..." or "# TYPE name type" line as the Go parser reads it (blanks after "#" optional).
DIRECTIVE = re.compile(r"#[ \t]*(HELP|TYPE)(?:[ \t]+(\S+))?(?:[ \t]+(.*))?$")
SAMPLE_NAME = re.compile(r"[^{\s]+")

# Sample names a family of each type owns in OpenMetrics; another family by such a name makes the
# whole exposition unparsable (client_python's text format pushes counters' `_created` as gauges).
OWNED_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
}


# Series Prometheus writes itself or fleetscope's rules and `check` read: a pushed family by such a name
# would forge or blind them (#35 items 1 and 2). Names with a colon are recording rules' by convention,
# and the text format keeps them (so does Prometheus 3's default negotiation).
PROMETHEUS_NAMES = frozenset({"ALERTS", "ALERTS_FOR_STATE", "up"})
# The same names as a Prometheus relabel regex (fully anchored), dropped by every scrape config deploy/ ships
# (`metric_relabel_configs`, `metricRelabelings`): defence in depth. Not fleetscope_*: the node's own series are.
RESERVED_NAMES_REGEX = "ALERTS|ALERTS_FOR_STATE|up|scrape_.*|.*:.*"


def reserved(name: str) -> str:
    """Why a pushed metric may not be called ``name`` ("" when it may)."""
    if name in PROMETHEUS_NAMES or name.startswith("scrape_"):
        return "is Prometheus's own series"
    if ":" in name:
        return "has a colon, which names recording rules"
    if name.startswith(NAMESPACE + "_"):
        return f"is in the daemon's own {NAMESPACE}_ namespace"
    return ""


def owned_names(name: str, kind: str) -> set[str]:
    return {name + suffix for suffix in OWNED_SUFFIXES.get(kind, ())}


class GroupTooLarge(Exception):
    """One group would hold more samples than it may (HTTP 413); nothing stored. ``limit`` names the
    limit (``max_group_samples``, a field of :class:`fleetscope.push.groups.GroupLimits`)."""

    def __init__(self, message: str, limit: str = "max_group_samples") -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class PushedSample:
    name: str
    labels: Labels
    value: float


@dataclass(frozen=True)
class PushedFamily:
    name: str
    type: str
    help: str
    samples: tuple[PushedSample, ...]
    size: int = 0  # bytes the family takes in the text exposition (at least: see exposition_bytes)

    def owned(self) -> set[str]:
        return owned_names(self.name, self.type)


# A sample line's bytes besides its name and labels: braces, a value as long as repr(float) makes it, newline.
SAMPLE_LINE_BYTES = 28


def label_bytes(name: str, value: str) -> int:
    """Bytes of ``,name="value"`` as exposed (``job`` as ``training_job``; quotes and backslashes escaped)."""
    exposed = EXPOSED_LABEL.get(name, name)
    return len(exposed) + len(value.encode()) + value.count("\\") + value.count('"') + 4


def exposition_bytes(name: str, help: str, samples: tuple[PushedSample, ...]) -> int:
    """What a family adds to the text exposition: HELP and TYPE lines and one line per sample.

    Counted in the group store's byte budget (``push.max-bytes``), so grouping labels repeated on every
    sample count for what they make ``/metrics`` (#35 item 1: a 12 KB label on 5,000 samples is 60 MB).
    """
    size = 2 * len(name) + len(help.encode()) + 32
    for sample in samples:
        size += len(sample.name) + SAMPLE_LINE_BYTES + sum(label_bytes(k, v) for k, v in sample.labels)
    return size


@dataclass
class _Lines:
    """What a line scan learns that the Python parser does not check."""

    text: str
    types: dict[str, str]  # name on a TYPE line -> its type (lower case)
    samples: int


def _scan(text: str, max_samples: int) -> _Lines:
    """The Go text parser's line-level rules, and the sample count before any parsing.

    A second HELP or TYPE for a name, a TYPE after samples of that name or of an unknown type, a
    sample line ending in a carriage return and a body not ending in a newline are refused, as the
    Pushgateway does. TYPE lines are rewritten in the form the Python parser reads (the Go parser
    takes "#TYPE" and "GAUGE" too); a bare "# TYPE" is a comment to both.
    """
    if text and not text.endswith("\n"):
        raise GroupError("body must end with a newline")
    if text.count("\n") > max_samples:
        _count_samples(text, max_samples)  # refuse a body with too many samples before splitting it up
    lines = text.split("\n")
    helps: set[str] = set()
    types: dict[str, str] = {}
    sampled: set[str] = set()
    count = 0
    rewritten = False
    for number, line in enumerate(lines, 1):
        stripped = line.lstrip(" \t")
        if not stripped:
            continue
        if stripped[0] == "#":
            match = DIRECTIVE.match(stripped)
            if match is None:
                continue
            kind, name, rest = match.groups()
            if name is None:
                lines[number - 1] = "#"
                rewritten = True
                continue
            if kind == "HELP":
                if name in helps:
                    raise GroupError(f"line {number}: second HELP line for metric {name!r}")
                helps.add(name)
                canonical = f"# HELP {name}" + (f" {rest}" if rest is not None else "")
            else:
                kind_name = (rest or "").strip().lower()
                if kind_name not in TEXT_TYPES:
                    raise GroupError(f"line {number}: unknown metric type {(rest or '').strip()!r} for {name!r}")
                if name in types:
                    raise GroupError(f"line {number}: second TYPE line for metric {name!r}")
                if name in sampled:
                    raise GroupError(f"line {number}: TYPE line for {name!r} after its samples")
                types[name] = kind_name
                canonical = f"# TYPE {name} {kind_name}"
            if stripped != canonical:
                lines[number - 1] = canonical
                rewritten = True
            continue
        count += 1
        if count > max_samples:
            raise GroupTooLarge(f"body has more than {max_samples} samples, the most one group may hold")
        if line.endswith("\r"):
            raise GroupError(f"line {number}: carriage return at the end of a sample line")
        match = SAMPLE_NAME.match(stripped)
        if match is not None:
            sampled.add(match.group())
    return _Lines("\n".join(lines) if rewritten else text, types, count)


def _count_samples(text: str, max_samples: int) -> None:
    """Raise :class:`GroupTooLarge` once more than ``max_samples`` sample lines are seen (one line in memory)."""
    count = 0
    start = 0
    while True:
        end = text.find("\n", start)
        if end < 0:
            return
        line = text[start:end].lstrip(" \t")
        start = end + 1
        if line and line[0] != "#":
            count += 1
            if count > max_samples:
                raise GroupTooLarge(f"body has more than {max_samples} samples, the most one group may hold")


@dataclass
class _Builder:
    name: str
    type: str
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def _float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _finite_count(value: float) -> bool:
    return not math.isnan(value) and value >= 0


class _Family:
    """Validates one parsed family against the text format and OpenMetrics, in series order."""

    def __init__(self, builder: _Builder, overrides: dict[str, str]) -> None:
        self.name = builder.name
        self.type = builder.type
        self.help = builder.help
        self._overrides = overrides
        self._raw = builder.samples

    def _labels(self, labels: dict[str, str]) -> dict[str, str]:
        for name, value in labels.items():
            # The grouping key's labels win over the body's (checked with the key); the body's training_job
            # gives way to the key's job below.
            if name not in self._overrides and name not in EXPOSED_LABEL.values():
                check_label(name, value, f"metric {self.name!r}")
        merged = {k: v for k, v in labels.items() if v != ""}  # an empty value is an absent label
        for name in self._overrides:  # the grouping label also wins over its exposed name in the body
            if name in EXPOSED_LABEL:
                merged.pop(EXPOSED_LABEL[name], None)
        merged.update(self._overrides)
        return {k: v for k, v in merged.items() if v != ""} if "" in self._overrides.values() else merged

    def build(self) -> PushedFamily:
        if self.type == "histogram":
            samples = self._histogram()
        elif self.type == "summary":
            samples = self._summary()
        else:
            samples = [(n, self._labels(labels), v) for n, labels, v in self._raw]
            if self.type == "counter":
                self._counter(samples)
        out: list[PushedSample] = []
        seen: set[tuple[str, Labels]] = set()
        for name, labels, value in samples:
            why = reserved(name)
            if why:
                raise ReservedName(f"metric {name!r} {why}")
            items = tuple(sorted(labels.items()))
            if (name, items) in seen:
                raise GroupError(f"sample {name}{dict(items)} appears twice")
            seen.add((name, items))
            out.append(PushedSample(name, items, value))
        return PushedFamily(self.name, self.type, self.help, tuple(out),
                            exposition_bytes(self.name, self.help, tuple(out)))

    def _counter(self, samples: list[tuple[str, dict[str, str], float]]) -> None:
        for name, labels, value in samples:
            if not _finite_count(value):
                raise GroupError(f"counter {name}{labels} is {value}: counters cannot be negative or NaN")

    def _series(self, own: str) -> dict[Labels, dict[str, list[tuple[dict[str, str], float]]]]:
        """Samples grouped by series (labels without ``own``), then by sample-name suffix."""
        if own in self._overrides:
            raise GroupError(f"grouping label {own!r} clashes with the {own!r} label of {self.type} {self.name!r}")
        series: dict[Labels, dict[str, list[tuple[dict[str, str], float]]]] = {}
        for name, raw_labels, value in self._raw:
            labels = self._labels(raw_labels)
            suffix = name[len(self.name):]
            key = tuple(sorted((k, v) for k, v in labels.items() if k != own))
            series.setdefault(key, {}).setdefault(suffix, []).append((labels, value))
        return series

    def _histogram(self) -> list[tuple[str, dict[str, str], float]]:
        out: list[tuple[str, dict[str, str], float]] = []
        for key, parts in self._series("le").items():
            where = f"histogram {self.name}{dict(key)}"
            unexpected = set(parts) - {"_bucket", "_sum", "_count"}
            if unexpected:
                raise GroupError(f"{where}: sample {self.name}{min(unexpected)} is not part of a histogram")
            buckets: dict[float, tuple[dict[str, str], float]] = {}
            for labels, value in parts.get("_bucket", []):
                bound = _float(labels.get("le", ""))
                if bound is None or math.isnan(bound):
                    raise GroupError(f"{where}: bucket le={labels.get('le')!r} is not a number")
                if bound in buckets:
                    raise GroupError(f"{where}: two buckets with le={bound:g}")
                if not _finite_count(value) or not float(value).is_integer():
                    raise GroupError(f"{where}: bucket le={labels['le']} count {value} is not a whole number")
                buckets[bound] = (labels, value)
            count = self._single(parts, "_count", where, "le")
            total = self._single(parts, "_sum", where, "le")
            inf = buckets.get(math.inf)
            if inf is None and count is None:
                raise GroupError(f"{where}: neither a +Inf bucket nor a _count")
            if inf is not None and count is not None and inf[1] != count[1]:
                raise GroupError(f"{where}: +Inf bucket {inf[1]:g} differs from _count {count[1]:g}")
            if inf is None and count is not None:
                buckets[math.inf] = ({**count[0], "le": "+Inf"}, count[1])
            if count is None:
                count = ({k: v for k, v in buckets[math.inf][0].items() if k != "le"}, buckets[math.inf][1])
            if total is None:
                raise GroupError(f"{where}: no _sum")
            if not _finite_count(count[1]) or not _finite_count(total[1]):
                raise GroupError(f"{where}: _count and _sum cannot be negative or NaN")
            previous = 0.0
            for bound in sorted(buckets):
                labels, value = buckets[bound]
                if value < previous:
                    raise GroupError(f"{where}: bucket le={labels['le']} counts fewer than a smaller bucket")
                previous = value
                out.append((self.name + "_bucket", labels, value))
            out.append((self.name + "_count", count[0], count[1]))
            out.append((self.name + "_sum", total[0], total[1]))
        return out

    def _summary(self) -> list[tuple[str, dict[str, str], float]]:
        out: list[tuple[str, dict[str, str], float]] = []
        for key, parts in self._series("quantile").items():
            where = f"summary {self.name}{dict(key)}"
            unexpected = set(parts) - {"", "_sum", "_count"}
            if unexpected:
                raise GroupError(f"{where}: sample {self.name}{min(unexpected)} is not part of a summary")
            quantiles: dict[float, tuple[dict[str, str], float]] = {}
            for labels, value in parts.get("", []):
                q = _float(labels.get("quantile", ""))
                if q is None or not 0 <= q <= 1:
                    raise GroupError(f"{where}: quantile={labels.get('quantile')!r} is not a number in [0, 1]")
                if q in quantiles:
                    raise GroupError(f"{where}: two samples for quantile {q:g}")
                if value < 0:
                    raise GroupError(f"{where}: quantile {q:g} is negative")
                quantiles[q] = (labels, value)
            count = self._single(parts, "_count", where, "quantile")
            total = self._single(parts, "_sum", where, "quantile")
            if (count is None) != (total is None):
                raise GroupError(f"{where}: _sum and _count go together")
            out += [(self.name, labels, value) for _, (labels, value) in sorted(quantiles.items())]
            if count is not None and total is not None:
                if not _finite_count(count[1]) or not _finite_count(total[1]):
                    raise GroupError(f"{where}: _count and _sum cannot be negative or NaN")
                out.append((self.name + "_count", count[0], count[1]))
                out.append((self.name + "_sum", total[0], total[1]))
        return out

    def _single(self, parts: dict[str, list[tuple[dict[str, str], float]]], suffix: str, where: str,
                own: str) -> tuple[dict[str, str], float] | None:
        found = parts.get(suffix, [])
        if len(found) > 1:
            raise GroupError(f"{where}: {self.name}{suffix} appears twice")
        if found and own in found[0][0]:
            raise GroupError(f"{where}: {self.name}{suffix} cannot carry a {own!r} label")
        return found[0] if found else None


def parse_exposition(text: str, key: GroupKey, max_samples: int = 1 << 62) -> tuple[PushedFamily, ...]:
    """Parse a pushed text-format body; grouping labels override the body's.

    Raises :class:`GroupError` (400) or :class:`GroupTooLarge` (413, counted before parsing).
    """
    lines = _scan(text, max_samples)
    try:
        parsed = parse_text_format(lines.text)
    except Exception as exc:
        raise GroupError(f"body is not valid Prometheus text format: {exc}") from None
    builders: dict[str, _Builder] = {}
    helps: dict[str, str] = {}
    for family in parsed:
        if family.documentation:
            helps.setdefault(family.name, family.documentation)
        if not family.samples:
            continue  # HELP/TYPE without samples: nothing to expose
        kind = family.type
        if kind == "counter" and lines.types.get(family.name) == "counter":
            # "# TYPE c counter" over samples named c: the parser renames them c_total (a quirk
            # fleetscope.compat.parse_text_format documents and tests/test_compat.py pins). Keep the
            # pushed name, as the Pushgateway does; without _total it can only be exposed untyped.
            kind = "unknown"
            samples = [(family.name, dict(s.labels), s.value) for s in family.samples]
        else:
            samples = [(s.name, dict(s.labels), s.value) for s in family.samples]
        if kind not in ("counter", "gauge", "histogram", "summary", "unknown"):
            raise GroupError(f"metric {family.name!r} has type {kind!r}, which the text format does not have")
        if any(s.timestamp is not None for s in family.samples):
            raise GroupError(f"metric {family.name!r} has a timestamp; pushed samples must not")
        target = builders.get(family.name)
        if target is None and kind == "unknown":
            # Samples of a histogram or summary the parser split off (they were not next to the rest).
            for suffix in ("_bucket", "_sum", "_count"):
                base = builders.get(family.name.removesuffix(suffix)) if family.name.endswith(suffix) else None
                if base is not None and base.type in ("histogram", "summary"):
                    target = base
                    break
        if target is None:
            target = builders[family.name] = _Builder(family.name, kind, "")
        elif kind not in ("unknown", target.type):
            raise GroupError(f"metric {family.name!r} is pushed as both {target.type} and {kind}")
        target.samples.extend(samples)
    overrides = dict(key)
    families: list[PushedFamily] = []
    for builder in builders.values():
        why = reserved(builder.name)
        if why:
            raise ReservedName(f"metric {builder.name!r} {why}")
        builder.help = helps.get(builder.name, "")
        families.append(_Family(builder, overrides).build())
    return _without_clashes(families)


def _without_clashes(families: list[PushedFamily]) -> tuple[PushedFamily, ...]:
    """Drop client_python's ``x_created`` gauges beside counter/histogram/summary ``x``; refuse other clashes."""
    owners = {name: f for f in families for name in f.owned()}
    kept: list[PushedFamily] = []
    for family in families:
        owner = owners.get(family.name)
        if owner is None:
            kept.append(family)
        elif not family.name.endswith("_created"):
            raise GroupError(f"metric {family.name!r} clashes with {owner.type} {owner.name!r}, which owns that "
                             "sample name in OpenMetrics")
    return tuple(kept)


