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

This module parses with ``prometheus_client.parser`` (the text format's
reference parser) but returns plain frozen dataclasses.
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetscope.config import PushConfig
from fleetscope.metrics.spec import NAMESPACE

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
GroupKey = tuple[tuple[str, str], ...]  # (("job", "train"), ("instance", "x")), in URL order
EXPOSED_LABEL = {"job": "training_job"}


# Sample names a family of each type owns in OpenMetrics; another family by such a name makes the
# whole exposition unparsable (client_python's text format pushes counters' `_created` as gauges).
OWNED_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created", "_gcount", "_gsum"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("_count", "_sum", "_created"),
    "info": ("_info",),
}


def owned_names(name: str, kind: str) -> set[str]:
    return {name + suffix for suffix in OWNED_SUFFIXES.get(kind, ())}


class GroupError(ValueError):
    """A push the Pushgateway would refuse (HTTP 400), with the reason."""


class GroupLimitExceeded(Exception):
    """More groups than push.max-groups; nothing stored."""


@dataclass(frozen=True)
class PushedSample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class PushedFamily:
    name: str
    type: str
    help: str
    samples: tuple[PushedSample, ...]


@dataclass(frozen=True)
class GroupView:
    key: GroupKey
    families: tuple[PushedFamily, ...]
    last_push_timestamp: float

    def exposed_labels(self) -> dict[str, str]:
        return {EXPOSED_LABEL.get(name, name): value for name, value in self.key}


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
    """``job/train/instance/x`` (the part after ``/metrics/``) -> grouping key."""
    segments = path.strip("/").split("/")
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


def parse_exposition(text: str, key: GroupKey) -> tuple[PushedFamily, ...]:
    """Parse a pushed text-format body; grouping labels override the body's."""
    from prometheus_client.parser import text_string_to_metric_families  # lazy: only pushes need it

    overrides = dict(key)
    families: dict[str, PushedFamily] = {}
    try:
        parsed = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, and sometimes worse, on garbage
        raise GroupError(f"body is not valid Prometheus text format: {exc}") from None
    for family in parsed:
        if not family.samples:
            continue  # HELP/TYPE without samples: nothing to expose
        if family.name.startswith(NAMESPACE + "_"):
            raise GroupError(f"metric {family.name!r} is in the daemon's own {NAMESPACE}_ namespace")
        if family.name in families:
            raise GroupError(f"metric family {family.name!r} appears twice")
        samples: list[PushedSample] = []
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for sample in family.samples:
            if sample.timestamp is not None:
                raise GroupError(f"sample {sample.name!r} has a timestamp; pushed samples must not")
            labels = {**sample.labels, **overrides}
            for name in overrides:  # the grouping label must also win over its exposed name in the body
                if name in EXPOSED_LABEL:
                    labels.pop(EXPOSED_LABEL[name], None)
            label_items = tuple(sorted(labels.items()))
            if (sample.name, label_items) in seen:
                raise GroupError(f"sample {sample.name}{dict(label_items)} appears twice")
            seen.add((sample.name, label_items))
            samples.append(PushedSample(sample.name, label_items, float(sample.value)))
        kind = family.type
        if kind == "counter" and any(s.name == family.name for s in samples):
            # A text-0.0.4 counter without _total cannot be re-exposed as an OpenMetrics counter.
            kind = "unknown"
        families[family.name] = PushedFamily(family.name, kind, family.documentation, tuple(samples))
    owned = set().union(*(owned_names(f.name, f.type) for f in families.values()))
    return tuple(f for f in families.values() if f.name not in owned)


class GroupStore:
    """Pushed groups by grouping key, with Pushgateway replace semantics and expiry."""

    def __init__(self, config: PushConfig, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[GroupKey, GroupView] = {}
        self.expired = 0

    def push(self, key: GroupKey, families: tuple[PushedFamily, ...], replace_all: bool) -> None:
        """PUT (``replace_all``) or POST a group. Raises GroupError / GroupLimitExceeded, storing nothing."""
        now = self._clock()
        with self._lock:
            self._sweep_locked(now)
            current = self._groups.get(key)
            if current is None and len(self._groups) >= self._config.max_groups:
                raise GroupLimitExceeded(
                    f"this node already holds {len(self._groups)} groups "
                    f"(push.max-groups={self._config.max_groups})"
                )
            # Consistency with other groups: one name, one type (the Pushgateway answers 400 too).
            for family in families:
                for other_key, group in self._groups.items():
                    if other_key == key:
                        continue
                    for other in group.families:
                        if other.name == family.name and other.type != family.type:
                            raise GroupError(
                                f"metric {family.name!r} pushed as {family.type} but group "
                                f"{dict(other_key)} has it as {other.type}"
                            )
            if replace_all or current is None:
                merged = families
            else:
                names = {f.name for f in families}
                merged = tuple(f for f in current.families if f.name not in names) + families
            self._groups[key] = GroupView(key, merged, now)

    def delete(self, key: GroupKey) -> bool:
        with self._lock:
            return self._groups.pop(key, None) is not None

    def _sweep_locked(self, now: float) -> None:
        ttl = self._config.group_ttl
        stale = [key for key, group in self._groups.items() if now - group.last_push_timestamp > ttl]
        for key in stale:
            del self._groups[key]
        self.expired += len(stale)

    def view(self) -> tuple[tuple[GroupView, ...], int]:
        """(live groups, groups expired so far)."""
        with self._lock:
            self._sweep_locked(self._clock())
            return tuple(self._groups.values()), self.expired
