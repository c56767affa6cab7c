"""Pushed groups by grouping key: Pushgateway replace semantics, budgets and expiry.

PUT replaces the whole group, POST replaces only the families it names, DELETE drops the group.
Unlike the Pushgateway, a group nobody pushes to for ``ttl`` seconds expires. Across groups, one
family name has one type, no family is named like another's OpenMetrics-owned samples and no series
is pushed by two groups, so the node's scrape stays parsable whatever is pushed.

Under the store's lock a push costs a few dictionary operations per sample (type, series and
sample-budget indexes); parsing (:mod:`fleetscope.push.textformat`) happens before, so scrapes never
wait on a large push. The limits are plain numbers (:class:`GroupLimits`); an exceeded one is named
by the exception's ``limit``, the field of :class:`GroupLimits` it broke.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from fleetscope.clock import Clock, Now, SystemClock
from fleetscope.push.grouping import EXPOSED_LABEL, GroupError, GroupKey
from fleetscope.push.textformat import GroupTooLarge, Labels, PushedFamily, label_bytes

LAST_PUSH_LINE_BYTES = 80  # fleetscope_push_group_last_push_timestamp_seconds{...} <value>


class GroupLimitExceeded(Exception):
    """More groups than ``max_groups``, or more samples than ``max_samples`` (HTTP 429); nothing stored."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class GroupLimits:
    """What the store may hold: groups, samples per group and in all, exposition bytes in all, and seconds a
    group lives unpushed."""

    max_groups: int
    max_group_samples: int
    max_samples: int
    ttl: float
    max_bytes: int = 8 << 20


@dataclass(frozen=True)
class GroupView:
    key: GroupKey
    families: tuple[PushedFamily, ...]
    last_push_timestamp: float  # Unix time in a view; an instant on the monotonic clock inside the store

    def exposed_labels(self) -> dict[str, str]:
        return {EXPOSED_LABEL.get(name, name): value for name, value in self.key}


def identity(key: GroupKey) -> Labels:
    """The labels a group's series are exposed with (an empty value is an absent label): two groups with the
    same identity would expose each other's series (#35 item 4)."""
    return tuple(sorted((EXPOSED_LABEL.get(name, name), value) for name, value in key if value))


def key_bytes(key: GroupKey) -> int:
    """What a group's own series (its last push time) adds to the exposition."""
    return LAST_PUSH_LINE_BYTES + sum(label_bytes(name, value) for name, value in key)


def families_bytes(families: Iterable[PushedFamily]) -> int:
    return sum(f.size for f in families)


@dataclass
class _Index:
    """Across all groups: each family name's type, the sample names typed families own, every series."""

    types: dict[str, tuple[str, int]] = field(default_factory=dict)  # family -> (type, groups holding it)
    owned: dict[str, tuple[str, int]] = field(default_factory=dict)  # owned sample name -> (owner, groups)
    series: dict[tuple[str, Labels], GroupKey] = field(default_factory=dict)
    identities: dict[Labels, GroupKey] = field(default_factory=dict)
    samples: int = 0
    bytes: int = 0  # exposition bytes of every group: families and last push times

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
            self.bytes += family.size

    def remove(self, families: Iterable[PushedFamily]) -> None:
        for family in families:
            self._release(self.types, family.name)
            for name in family.owned():
                self._release(self.owned, name)
            for sample in family.samples:
                self.series.pop((sample.name, sample.labels), None)
            self.samples -= len(family.samples)
            self.bytes -= family.size

    def add_group(self, key: GroupKey) -> None:
        self.identities[identity(key)] = key
        self.bytes += key_bytes(key)

    def remove_group(self, key: GroupKey) -> None:
        self.identities.pop(identity(key), None)
        self.bytes -= key_bytes(key)

    @staticmethod
    def _release(table: dict[str, tuple[str, int]], name: str) -> None:
        value, held = table[name]
        if held > 1:
            table[name] = (value, held - 1)
        else:
            del table[name]


class GroupStore:
    """Pushed groups by grouping key, with Pushgateway replace semantics, budgets and expiry."""

    def __init__(self, limits: GroupLimits, clock: Clock | None = None) -> None:
        self._limits = limits
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
            if current is None and len(self._groups) >= self._limits.max_groups:
                raise GroupLimitExceeded(
                    f"this node already holds {len(self._groups)} groups, the most it may hold", "max_groups")
            names = {f.name for f in families}
            previous = () if current is None else current.families
            replaced = tuple(f for f in previous if replace_all or f.name in names)
            kept = tuple(f for f in previous if not (replace_all or f.name in names))
            group_samples = sum(len(f.samples) for f in kept + families)
            if group_samples > self._limits.max_group_samples:
                raise GroupTooLarge(
                    f"group would hold {group_samples} samples; one group may hold {self._limits.max_group_samples}")
            total = self._index.samples - sum(len(f.samples) for f in replaced) + sum(
                len(f.samples) for f in families)
            if total > self._limits.max_samples:
                raise GroupLimitExceeded(
                    f"pushed groups would hold {total} samples; this node holds at most {self._limits.max_samples}",
                    "max_samples")
            size = (self._index.bytes - families_bytes(replaced) + families_bytes(families)
                    + (key_bytes(key) if current is None else 0))
            if size > self._limits.max_bytes:
                raise GroupLimitExceeded(
                    f"pushed groups would take {size} bytes of /metrics; this node allows {self._limits.max_bytes}",
                    "max_bytes")
            shadowed = self._index.identities.get(identity(key))
            if shadowed is not None and shadowed != key:
                raise GroupError(f"group {dict(key)} would expose the same labels as group {dict(shadowed)}")
            self._check_consistency(key, families, {f.name for f in replaced})
            self._index.remove(replaced)
            self._index.add(key, families)
            if current is None:
                self._index.add_group(key)
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
            self._index.remove_group(key)
            return True

    def _sweep_locked(self, now: float) -> None:
        ttl = self._limits.ttl
        stale = [key for key, group in self._groups.items() if now - group.last_push_timestamp > ttl]
        for key in stale:
            self._index.remove(self._groups.pop(key).families)
            self._index.remove_group(key)
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

    def bytes(self) -> int:
        """Exposition bytes the groups take, as the byte budget counts them."""
        with self._lock:
            return self._index.bytes
