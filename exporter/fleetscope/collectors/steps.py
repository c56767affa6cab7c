"""Pushed training steps and Pushgateway-style groups, exposed at scrape time.

The collector owns the in-memory stores and the push API router; it is a
live collector, so every scrape reads the stores directly (a cheap, locked
snapshot).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from fleetscope import wire
from fleetscope.clock import Clock, SystemClock
from fleetscope.collectors.protocol import App, Collector, HasRouters
from fleetscope.config import Config
from fleetscope.metrics import push, training
from fleetscope.metrics.families import FamilyBuilder
from fleetscope.push.groups import GroupLimits, GroupStore, GroupView
from fleetscope.push.process import ProcessTable
from fleetscope.push.store import RankView, StepStore, StoreView
from fleetscope.push.textformat import PushedFamily, owned_names
from fleetscope.wire import Role

if TYPE_CHECKING:
    from fastapi import APIRouter

# Series labels of a rank: its key (job exposed as training_job, see docs/design.md) and LABEL fields.
LABEL_FIELDS = wire.names(Role.LABEL, wire.RANK_FIELDS)
RANK_LABELS = ("training_job", "rank", *LABEL_FIELDS)
VALUE_SPECS = tuple((key, spec) for key, spec in training.TABLE.specs.items() if spec.kind != "info")


def _label(value: object) -> str:
    # Unknown placement is an empty label value: Prometheus treats it as "label absent".
    return "" if value is None else str(value)


def add_rank(builder: FamilyBuilder, rank: RankView, process_up: bool | None = None) -> None:
    labels = (rank.job, str(rank.rank), *(_label(rank.fields.get(name)) for name in LABEL_FIELDS))
    for key, spec in VALUE_SPECS:
        builder.add(spec, labels, rank.values.get(key))
    info = training.RANK_INFO
    builder.add_info(info, labels, {key: _label(rank.fields.get(key)) for key in info.info_keys})
    position = rank.position
    if position is not None:
        # One series per phase, 0 or 1: a phase label that moved with the rank would start a new series
        # at every change, and a scrape could catch none.
        for phase in wire.PHASES:
            builder.add(training.PHASE, (*labels, phase), 1 if phase == position.phase else 0)
        builder.add(training.PHASE_START_TIMESTAMP_SECONDS, labels, position.since)
        builder.add(training.CURRENT_STEP, labels, position.step)
    if process_up is not None:
        builder.add(training.PROCESS_UP, labels, 1 if process_up else 0)


def add_receiver(builder: FamilyBuilder, view: StoreView, groups: int, groups_expired: int) -> None:
    builder.add(push.TABLE["records"], (), view.records_total)
    for reason, count in sorted(view.rejected.items()):
        builder.add(push.TABLE["rejected"], (reason,), count)
    builder.add(push.TABLE["jobs"], (), view.jobs)
    builder.add(push.TABLE["ranks"], (), len(view.ranks))
    builder.add(push.TABLE["expired"], ("rank",), view.expired.get("rank", 0))
    builder.add(push.TABLE["expired"], ("group",), groups_expired)
    builder.add(push.TABLE["groups"], (), groups)
    builder.add(push.SCRAPE_TIMESTAMP_SECONDS, (), view.wall)


def pushed_families(groups: tuple[GroupView, ...]) -> list[Metric]:
    """Pushed families merged by name across groups."""
    merged: dict[str, Metric] = {}
    # A family clashing with another group's (e.g. a gauge x_created beside a counter x) is left out:
    # one clash would make the whole OpenMetrics exposition unparsable.
    owned = set().union(*(owned_names(f.name, f.type) for g in groups for f in g.families))
    for group in groups:
        for family in group.families:
            if family.name in owned:
                continue
            metric = merged.get(family.name)
            if metric is None:
                metric = merged[family.name] = Metric(family.name, family.help, family.type)
            for sample in family.samples:
                labels = {("training_job" if k == "job" else k): v for k, v in sample.labels}
                metric.add_sample(sample.name, labels, sample.value)
    return [m for m in merged.values() if m.samples]


def last_push_family(groups: tuple[GroupView, ...]) -> list[Metric]:
    """Each group's last push time (none without groups)."""
    spec = push.TABLE["group_last_push"]
    last_push = Metric(spec.name, spec.help, "gauge")
    for group in groups:
        last_push.add_sample(spec.name, group.exposed_labels(), group.last_push_timestamp)
    return [last_push] if last_push.samples else []


def group_families(groups: tuple[GroupView, ...]) -> list[Metric]:
    """Pushed families merged by name across groups, plus each group's last push time."""
    return pushed_families(groups) + last_push_family(groups)


class _PushedCache:
    """The merged families of the last scrape, reused while every group holds the same families.

    A push replaces a group's families tuple, so identity says "unchanged"; holding the tuples keeps
    their ids from being reused. Pushes are rare beside scrapes, and merging 10,000 pushed samples
    cost about half of a scrape's CPU.
    """

    def __init__(self) -> None:
        self._last: tuple[tuple[tuple[PushedFamily, ...], ...], list[Metric]] = ((), [])  # one reference: swapped whole

    def families(self, groups: tuple[GroupView, ...]) -> list[Metric]:
        held = tuple(group.families for group in groups)
        families, metrics = self._last
        if len(held) != len(families) or any(a is not b for a, b in zip(held, families, strict=True)):
            metrics = pushed_families(groups)  # built, never changed after: served to many scrapes
            self._last = (held, metrics)
        return metrics


class StepsCollector(Collector, HasRouters):
    name = "steps"
    tables = (training.TABLE, training.POSITION_TABLE, push.TABLE)

    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        # The store's own table: it asks from push threads, under its lock, while scrapes use self.processes.
        self.store = StepStore(config.push, self.clock, alive=ProcessTable(config.path.procfs).alive)
        limits = GroupLimits(max_groups=config.push.max_groups, max_group_samples=config.push.max_group_samples,
                             max_samples=config.push.max_samples, ttl=config.push.group_ttl,
                             max_bytes=config.push.max_bytes)
        self.groups = GroupStore(limits, self.clock)
        self.processes = ProcessTable(config.path.procfs)
        self._pushed = _PushedCache()

    def routers(self) -> list[tuple[App, APIRouter]]:
        from fleetscope.push.api import build_router  # lazy: FastAPI is only needed when serving

        return [("push", build_router(self.store, self.groups, self.config.push))]

    def _process_up(self, rank: RankView) -> bool | None:
        process = rank.process
        if process is None or (rank.position is not None and rank.position.phase == "ended"):
            return None  # an older client, report() from elsewhere, or a goodbye: nothing to watch
        return self.processes.alive(*process)

    def collect(self) -> list[Metric]:
        now = self.clock.read()  # one reading: every Unix time of this scrape is on it
        view = self.store.view(now)
        groups, groups_expired = self.groups.view(now)
        builder = FamilyBuilder()
        for rank in sorted(view.ranks, key=lambda r: (r.job, r.rank)):
            add_rank(builder, rank, self._process_up(rank))
        self.processes.forget({rank.process for rank in view.ranks if rank.process is not None})
        add_receiver(builder, view, len(groups), groups_expired)
        builder.add(push.GROUP_SAMPLES, (), sum(len(f.samples) for g in groups for f in g.families))
        builder.add(push.GROUP_BYTES, (), self.groups.bytes())
        return builder.families() + self._pushed.families(groups) + last_push_family(groups)
