"""Pushgateway-compatible groups: what ``prometheus_client.push_to_gateway`` sends.

A group is named by its grouping key, the URL path
``/metrics/job/<job>{/<label>/<value>}`` (a segment ``<label>@base64`` means
its value is URL-safe base64, as the Pushgateway and client_python use for
values containing ``/``). Semantics follow the Pushgateway: PUT replaces the
whole group, POST replaces only the families it names, DELETE drops the
group; grouping labels override labels of the same name in the body, and
samples must not carry timestamps. Unlike the Pushgateway, a group nobody
pushes to for ``push.group-ttl`` expires.

The grouping label ``job`` is exposed as ``training_job``: ``job`` is
Prometheus's own target label (see docs/design.md).

What is accepted matches Pushgateway 1.5.1 on the text format (tested side by
side with the real binary): untyped families, samples of one family spread
over the body, HELP after samples, case-insensitive types; a second HELP or
TYPE line, a TYPE after the family's samples, a type outside the text
format's five, a non-float ``le`` or ``quantile``, a repeated sample or a
series another group already exposes answer 400. Where the Pushgateway
accepts data that it then re-exposes in a form OpenMetrics parsers refuse
(histogram buckets out of order or without ``+Inf`` and ``_count``, a
negative counter, a quantile outside [0, 1], a ``le`` grouping label on a
histogram, a family clashing with another's ``_total``/``_bucket``/...
samples), this receiver answers 400 instead, so one push can never make the
node's whole scrape unparsable. Missing pieces that are the same quantity
are filled in (a histogram's ``+Inf`` bucket from its ``_count`` and back);
nothing is invented.

Parsing and validation are linear in the body and run before the store's
lock is taken; under the lock, a push costs a few dictionary operations per
sample (type, series and sample-budget indexes), so scrapes never wait on a
large push. The sample budget (``push.max-group-samples`` per group,
``push.max-samples`` in all) bounds memory and the time a scrape spends on
pushed groups.

This module parses with ``prometheus_client.parser`` (the text format's
reference parser), adds the checks the Go parser makes and it does not, and
returns plain frozen dataclasses.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from fleetscope.clock import Clock, Now, SystemClock
from fleetscope.config import PushConfig
from fleetscope.metrics.spec import NAMESPACE

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
GroupKey = tuple[tuple[str, str], ...]  # (("job", "train"), ("instance", "x")), in URL order
Labels = tuple[tuple[str, str], ...]
EXPOSED_LABEL = {"job": "training_job"}

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


def owned_names(name: str, kind: str) -> set[str]:
    return {name + suffix for suffix in OWNED_SUFFIXES.get(kind, ())}


class GroupError(ValueError):
    """A push refused as invalid (HTTP 400), with the reason."""


class GroupTooLarge(Exception):
    """One group would hold more samples than push.max-group-samples (HTTP 413); nothing stored."""


class GroupLimitExceeded(Exception):
    """More groups than push.max-groups, or more samples than push.max-samples (HTTP 429); nothing stored."""


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

    def owned(self) -> set[str]:
        return owned_names(self.name, self.type)


@dataclass(frozen=True)
class GroupView:
    key: GroupKey
    families: tuple[PushedFamily, ...]
    last_push_timestamp: float  # Unix time in a view; an instant on the monotonic clock inside the store

    def exposed_labels(self) -> dict[str, str]:
        return {EXPOSED_LABEL.get(name, name): value for name, value in self.key}


# -- grouping key -------------------------------------------------------------------------------


def _decode(segment: str, value: str) -> tuple[str, str]:
    if segment.endswith("@base64"):
        name = segment.removesuffix("@base64")
        padded = value + "=" * (-len(value) % 4)
        try:
            decoded = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            raise GroupError(f"invalid base64 value for label {name!r}") from None
        return name, decoded
    return segment, value


def parse_group_path(path: str) -> GroupKey:
    """``job/train/instance/x`` (the part after ``/metrics/``) -> grouping key.

    A trailing slash is an empty last value (``job/train/instance/`` is ``instance=""``), as in the
    Pushgateway.
    """
    segments = path.removeprefix("/").split("/")
    if len(segments) < 2 or len(segments) % 2:
        raise GroupError("grouping key must be job/<job> followed by <label>/<value> pairs")
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for index in range(0, len(segments), 2):
        name, value = _decode(segments[index], segments[index + 1])
        if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise GroupError(f"invalid label name {name!r} in grouping key")
        if name in seen:
            raise GroupError(f"label {name!r} repeated in grouping key")
        seen.add(name)
        pairs.append((name, value))
    if pairs[0][0] != "job" or not pairs[0][1]:
        raise GroupError("grouping key must start with a non-empty job")
    return tuple(pairs)


# -- the body -----------------------------------------------------------------------------------


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
            raise GroupTooLarge(
                f"body has more than {max_samples} samples, the most one group may hold (push.max-group-samples)")
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
                raise GroupTooLarge(f"body has more than {max_samples} samples, the most one group may hold "
                                    "(push.max-group-samples)")


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
            items = tuple(sorted(labels.items()))
            if (name, items) in seen:
                raise GroupError(f"sample {name}{dict(items)} appears twice")
            seen.add((name, items))
            out.append(PushedSample(name, items, value))
        return PushedFamily(self.name, self.type, self.help, tuple(out))

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
    from prometheus_client.parser import text_string_to_metric_families  # lazy: only pushes need it

    lines = _scan(text, max_samples)
    try:
        parsed = list(text_string_to_metric_families(lines.text))
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
            # "# TYPE c counter" over samples named c: the parser renames them c_total. Keep the
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
        if builder.name.startswith(NAMESPACE + "_"):
            raise GroupError(f"metric {builder.name!r} is in the daemon's own {NAMESPACE}_ namespace")
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


# -- the store ----------------------------------------------------------------------------------


@dataclass
class _Index:
    """Across all groups: each family name's type, the sample names typed families own, every series."""

    types: dict[str, tuple[str, int]] = field(default_factory=dict)  # family -> (type, groups holding it)
    owned: dict[str, tuple[str, int]] = field(default_factory=dict)  # owned sample name -> (owner, groups)
    series: dict[tuple[str, Labels], GroupKey] = field(default_factory=dict)
    samples: int = 0

    def add(self, key: GroupKey, families: Iterable[PushedFamily]) -> None:
        for family in families:
            kind, held = self.types.get(family.name, (family.type, 0))
            self.types[family.name] = (kind, held + 1)
            for name in family.owned():
                owner, held = self.owned.get(name, (family.name, 0))
                self.owned[name] = (owner, held + 1)
            for sample in family.samples:
                self.series[(sample.name, sample.labels)] = key
            self.samples += len(family.samples)

    def remove(self, families: Iterable[PushedFamily]) -> None:
        for family in families:
            self._release(self.types, family.name)
            for name in family.owned():
                self._release(self.owned, name)
            for sample in family.samples:
                self.series.pop((sample.name, sample.labels), None)
            self.samples -= len(family.samples)

    @staticmethod
    def _release(table: dict[str, tuple[str, int]], name: str) -> None:
        value, held = table[name]
        if held > 1:
            table[name] = (value, held - 1)
        else:
            del table[name]


class GroupStore:
    """Pushed groups by grouping key, with Pushgateway replace semantics, budgets and expiry."""

    def __init__(self, config: PushConfig, clock: Clock | None = None) -> None:
        self._config = config
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._groups: dict[GroupKey, GroupView] = {}
        self._index = _Index()
        self.expired = 0

    def push(self, key: GroupKey, families: tuple[PushedFamily, ...], replace_all: bool) -> None:
        """PUT (``replace_all``) or POST a group.

        Raises GroupError (400), GroupTooLarge (413) or GroupLimitExceeded (429), storing nothing.
        """
        now = self._clock.read().monotonic  # expiry on a clock that no one sets
        with self._lock:
            self._sweep_locked(now)
            current = self._groups.get(key)
            if current is None and len(self._groups) >= self._config.max_groups:
                raise GroupLimitExceeded(
                    f"this node already holds {len(self._groups)} groups "
                    f"(push.max-groups={self._config.max_groups})"
                )
            names = {f.name for f in families}
            previous = () if current is None else current.families
            replaced = tuple(f for f in previous if replace_all or f.name in names)
            kept = tuple(f for f in previous if not (replace_all or f.name in names))
            group_samples = sum(len(f.samples) for f in kept + families)
            if group_samples > self._config.max_group_samples:
                raise GroupTooLarge(
                    f"group would hold {group_samples} samples; one group may hold "
                    f"{self._config.max_group_samples} (push.max-group-samples)")
            total = self._index.samples - sum(len(f.samples) for f in replaced) + sum(
                len(f.samples) for f in families)
            if total > self._config.max_samples:
                raise GroupLimitExceeded(
                    f"pushed groups would hold {total} samples; this node holds at most "
                    f"{self._config.max_samples} (push.max-samples)")
            self._check_consistency(key, families, {f.name for f in replaced})
            self._index.remove(replaced)
            self._index.add(key, families)
            self._groups[key] = GroupView(key, kept + families, now)

    def _check_consistency(self, key: GroupKey, families: tuple[PushedFamily, ...], leaving: set[str]) -> None:
        """One name, one type; no family named like another's owned samples; no series twice.

        An ``x_created`` family beside another group's counter, histogram or summary ``x`` is let
        through: the exposition leaves it out, as within one body (client_python pushes them).
        """
        index = self._index
        for family in families:
            held = index.types.get(family.name)
            if held is not None and held[0] != family.type and not (held[1] == 1 and family.name in leaving):
                raise GroupError(f"metric {family.name!r} pushed as {family.type} but another group has it as "
                                 f"{held[0]}")
            owner = index.owned.get(family.name)
            if owner is not None and not family.name.endswith("_created") and not (
                    owner[1] == 1 and owner[0] in leaving):
                raise GroupError(f"metric {family.name!r} clashes with {owner[0]!r} pushed by another group, "
                                 "which owns that sample name in OpenMetrics")
            for name in family.owned():
                if name.endswith("_created"):
                    continue
                if name in index.types and not (index.types[name][1] == 1 and name in leaving):
                    raise GroupError(f"{family.type} {family.name!r} clashes with metric {name!r} pushed by "
                                     "another group")
            for sample in family.samples:
                holder = index.series.get((sample.name, sample.labels))
                if holder is not None and holder != key:
                    raise GroupError(f"sample {sample.name}{dict(sample.labels)} is already pushed by group "
                                     f"{dict(holder)}")

    def delete(self, key: GroupKey) -> bool:
        with self._lock:
            group = self._groups.pop(key, None)
            if group is None:
                return False
            self._index.remove(group.families)
            return True

    def _sweep_locked(self, now: float) -> None:
        ttl = self._config.group_ttl
        stale = [key for key, group in self._groups.items() if now - group.last_push_timestamp > ttl]
        for key in stale:
            self._index.remove(self._groups.pop(key).families)
        self.expired += len(stale)

    def view(self, now: Now | None = None) -> tuple[tuple[GroupView, ...], int]:
        """(live groups, groups expired so far); last pushes as Unix time on the wall clock of ``now``."""
        with self._lock:
            now = now or self._clock.read()
            self._sweep_locked(now.monotonic)
            groups = tuple(replace(g, last_push_timestamp=now.unix(g.last_push_timestamp))
                           for g in self._groups.values())
            return groups, self.expired

    def samples(self) -> int:
        with self._lock:
            return self._index.samples
