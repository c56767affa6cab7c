"""The simulated cluster: node models, their daemons (one process each), jobs pushing steps, faults.

:class:`SimCluster` owns everything it starts and stops it again; the tick
loop runs in the caller's thread (or a thread the caller makes) and never
raises on a failed push or a dead node process: a simulator that crashes on
a fault would be a poor way to test fault detection.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from fleetscope_sim.faults import Fault
from fleetscope_sim.harness import READY_TIMEOUT, Daemon
from fleetscope_sim.inspector import InspectorNode, StepCollectives
from fleetscope_sim.node import Load, NodeModel
from fleetscope_sim.profiles import NodeProfile, profile
from fleetscope_sim.training import JobModel, JobSpec, Position, RankState
from fleetscope_sim.tree import NodePaths, TreeWriter

logger = logging.getLogger(__name__)
CLOCK_TICKS = 100  # USER_HZ: /proc/<pid>/stat's start time is in these after boot
# Twenty daemons share two cores here, not one daemon a node: a report answered after the client's 2 s
# counts as failed and backs off (up to 30 s), so steps reached Prometheus late enough to look like a hang.
SEND_TIMEOUT = 10.0


@dataclass(frozen=True)
class NodeSpec:
    name: str
    profile: NodeProfile
    port: int


@dataclass(frozen=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]
    jobs: tuple[JobSpec, ...]
    faults: tuple[Fault, ...] = ()
    host: str = "127.0.0.1"
    tick: float = 1.0  # seconds between model updates
    collector_interval: float = 2.5  # the node daemons' background collection interval
    seed: int = 1
    daemon_settings: tuple[tuple[str, str], ...] = ()  # extra (key, value) config settings for every node daemon

    def node(self, name: str) -> NodeSpec:
        for spec in self.nodes:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def job_on(self, node: str) -> JobSpec | None:
        for job in self.jobs:
            if node in job.nodes:
                return job
        return None

    def job(self, name: str) -> JobSpec:
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(name)

    def validate(self) -> None:
        """Refuse a schedule that names nodes, jobs, GPUs or devices the cluster does not have."""
        names = {n.name for n in self.nodes}
        jobs = {j.name: j for j in self.jobs}
        for job in self.jobs:
            unknown = set(job.nodes) - names
            if unknown:
                raise ValueError(f"job {job.name} runs on unknown nodes {sorted(unknown)}")
        for fault in self.faults:
            if fault.node is not None:
                if fault.node not in names:
                    raise ValueError(f"{fault.label()}: no node {fault.node}")
                node = self.node(fault.node)
                if fault.gpu is not None and not 0 <= fault.gpu < node.profile.gpu_count:
                    raise ValueError(f"{fault.label()}: {fault.node} has no GPU {fault.gpu}")
                if fault.device is not None and fault.device not in (
                        node.profile.efa_devices + node.profile.ena_interfaces):
                    raise ValueError(f"{fault.label()}: {fault.node} has no device {fault.device}")
            if fault.job is not None:
                if fault.job not in jobs:
                    raise ValueError(f"{fault.label()}: no job {fault.job}")
                if fault.rank is not None and not 0 <= fault.rank < jobs[fault.job].world_size:
                    raise ValueError(f"{fault.label()}: {fault.job} has no rank {fault.rank}")


def make_cluster(
    nodes: int = 8,
    jobs: int = 2,
    base_port: int = 9500,
    profiles: Sequence[str] = ("p5.48xlarge", "p4d.24xlarge"),
    faults: Sequence[Fault] = (),
    step_seconds: float = 2.0,
    **kwargs: Any,
) -> ClusterSpec:
    """``nodes`` nodes named node-00..., profiles alternating, split evenly into ``jobs`` jobs (job-a, job-b...).

    ``jobs=0`` gives idle nodes, for real training processes to push to. ``base_port=0``: each node daemon binds
    a port the kernel chooses (:attr:`SimCluster.addresses`).
    """
    if nodes < 1 or jobs < 0 or jobs > nodes:
        raise ValueError("need at least one node, and at least one node per job")
    node_specs = tuple(
        NodeSpec(f"node-{i:02d}", profile(profiles[i % len(profiles)]), base_port + i if base_port else 0)
        for i in range(nodes)
    )
    per_job = nodes // max(jobs, 1)
    job_specs = []
    for j in range(jobs):
        members = node_specs[j * per_job:(j + 1) * per_job if j < jobs - 1 else nodes]
        job_specs.append(JobSpec(f"job-{chr(ord('a') + j)}", tuple(n.name for n in members),
                                 step_seconds=step_seconds * (1 + 0.1 * j)))
    spec = ClusterSpec(node_specs, tuple(job_specs), tuple(faults), **kwargs)
    spec.validate()
    return spec


@dataclass
class SimNode:
    spec: NodeSpec
    model: NodeModel
    writer: TreeWriter
    daemon: Daemon | None = None

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self.daemon.process if self.daemon is not None else None

    @property
    def log_path(self) -> str:
        return str(self.daemon.log_path) if self.daemon is not None else ""

    @property
    def paths(self) -> NodePaths:
        return self.writer.paths


class Pusher(Protocol):
    """Where the ranks' reports go: :class:`ClientPusher` (each rank's real client, over HTTP) or, in virtual
    time, :class:`fleetscope_sim.virtual.WirePusher` (the same report bodies, into each node's store in process)."""

    def steps(self, node: str, job: JobSpec, records: list[dict[str, Any]]) -> None: ...

    def position(self, node: str, job: JobSpec, rank: int, where: Position | None) -> None: ...

    def close(self) -> None: ...


class ClientPusher:
    """Each simulated rank pushes through its own :class:`fleetscope.client.StepTracker`, as a real rank would.

    Its steps as :meth:`StepTracker.report`, where it is inside the open step as
    :meth:`StepTracker.now_in` (sent once a second by the tracker's sender, steps or not), and the
    pid and start time of its simulated process (``process_of``), which its node's procfs shows, in
    place of the simulator's own. A rank whose process dies stops at once, without a goodbye.
    """

    def __init__(self, url_of: Callable[[str], str], flush_interval: float = 1.0,
                 process_of: Callable[[str, int], tuple[int, int] | None] | None = None) -> None:
        self._url_of = url_of
        self._flush_interval = flush_interval
        self._process_of = process_of
        self._trackers: dict[tuple[str, int], Any] = {}
        self._told: dict[tuple[str, int], tuple[int, str]] = {}  # (step, phase) each tracker last said
        self._dead: set[tuple[str, int]] = set()

    def _tracker(self, node: str, job: JobSpec, rank: int) -> Any:
        from fleetscope.client import StepTracker

        key = (job.name, rank)
        tracker = self._trackers.get(key)
        if tracker is None:
            local = rank % job.ranks_per_node
            tracker = self._trackers[key] = StepTracker(
                job=job.name, rank=rank, local_rank=local, world_size=job.world_size, pp_stage=0, dp_rank=rank,
                gpu=local, url=self._url_of(node), flush_interval=self._flush_interval, timeout=SEND_TIMEOUT,
                environ={},
            )
            process = self._process_of(job.name, rank) if self._process_of is not None else None
            if process is not None and tracker.sender.rank_fields is not None:
                # Before its sender's first report (a flush interval away): the rank's own process.
                tracker.sender.rank_fields.update(pid=process[0], start_time=process[1])
        return tracker

    def steps(self, node: str, job: JobSpec, records: list[dict[str, Any]]) -> None:
        for record in records:
            key = (job.name, record["rank"])
            if key in self._dead:
                continue
            self._tracker(node, job, record["rank"]).report(
                record["step_seconds"], record["step"], data_seconds=record["data_seconds"],
                compute_seconds=record["compute_seconds"], comm_seconds=record["comm_seconds"],
                tokens=record["tokens"], samples=record["samples"], loss=record["loss"], timestamp=record["timestamp"],
            )
            self._told.pop(key, None)  # report() moved the tracker to the next step, idle

    def position(self, node: str, job: JobSpec, rank: int, where: Position | None) -> None:
        """Where a rank is now (``None``: its process died, and its tracker stops without a goodbye)."""
        key = (job.name, rank)
        if key in self._dead:
            return
        tracker = self._tracker(node, job, rank)
        if where is None:
            self._dead.add(key)
            tracker.close(goodbye=False)
            return
        said = (where.step, where.phase)
        if self._told.get(key) != said:  # now_in() starts the phase's clock: only when it changes
            tracker.now_in(where.phase, where.step)
            self._told[key] = said

    def close(self) -> None:
        for key, tracker in self._trackers.items():
            if key not in self._dead:
                tracker.close(timeout=1.0)
        self._trackers.clear()


@dataclass
class SimCluster:
    spec: ClusterSpec
    workdir: str
    pusher: Pusher | None = None  # made at the first push: each rank's tracker, to its node's daemon
    wall: Callable[[], float] = time.time  # the nodes' clock when they are built (their boot time is read off it)
    # Every tree file replaced by a rename, for daemons reading in other processes; a cluster whose trees are read
    # only between ticks, in its own thread, writes them in place (see kernel_tree.FileTree.atomic).
    atomic_trees: ClassVar[bool] = True
    nodes: dict[str, SimNode] = field(default_factory=dict)
    jobs: list[JobModel] = field(default_factory=list)
    collectives: list[StepCollectives] = field(default_factory=list)  # per job: its ranks' NCCL Inspector output
    started_at: float = 0.0  # Unix time of simulation time 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _clock_started: bool = False
    _next_tree_write: dict[str, float] = field(default_factory=dict)
    _exited: set[tuple[str, int]] = field(default_factory=set)  # (job, rank) whose process died
    _thread: threading.Thread | None = None
    addresses: dict[str, str] = field(default_factory=dict)  # node -> host:port its daemon bound
    # The longest stretch between two ticks (seconds, and the simulation time it ended at). Ranks report where
    # they are only at ticks: through a stretch past the hang rules' 15 s floor every simulated rank stays where it
    # was, its peers waiting in a collective, a hang to any observer (a real job's ranks never wait on this loop).
    longest_tick_gap: tuple[float, float] = (0.0, 0.0)

    # -- lifecycle -----------------------------------------------------------------------------

    def build(self) -> None:
        """Create every node's model and tree (no processes yet)."""
        self.spec.validate()
        for i, node_spec in enumerate(self.spec.nodes):
            model = NodeModel(node_spec.name, i, node_spec.profile, seed=self.spec.seed * 1000 + i)
            writer = TreeWriter(model, NodePaths(os.path.join(self.workdir, node_spec.name)), now=self.wall(),
                                atomic=self.atomic_trees)
            writer.setup()
            self.nodes[node_spec.name] = SimNode(node_spec, model, writer)
        self.jobs = [JobModel(spec, seed=self.spec.seed * 7919 + j) for j, spec in enumerate(self.spec.jobs)]
        inspector = {name: InspectorNode(node.paths.nccl_dir, node.paths.procfs, hostname=name)
                     for name, node in self.nodes.items()}
        self.collectives = []
        for j, spec in enumerate(self.spec.jobs):
            collectives = StepCollectives(
                spec.name, [(name, inspector[name]) for name in spec.nodes], spec.ranks_per_node,
                transfer_seconds=spec.step_seconds * spec.comm_share, seed=self.spec.seed * 7919 + j)
            collectives.start({name: int(self.nodes[name].model.uptime * CLOCK_TICKS) for name in spec.nodes})
            self.collectives.append(collectives)

    def start(self, ready_timeout: float = READY_TIMEOUT) -> None:
        """Build, start one daemon process per node and wait until each answers /readyz.

        A node whose spec has port 0 binds one the kernel chooses; :attr:`addresses` has what each bound."""
        if not self.nodes:
            self.build()
        self.started_at = time.time()
        for node in self.nodes.values():
            node.daemon = Daemon.simulated_node(
                self.workdir, node.paths.root, self.spec.collector_interval, node.spec.name,
                self.spec.daemon_settings, listen=f"{self.spec.host}:{node.spec.port}")
            node.daemon.spawn()
        self.wait_ready(ready_timeout)

    def wait_ready(self, timeout: float) -> None:
        """Every node daemon started together, so their waits overlap: together they have ``timeout`` s."""
        deadline = time.monotonic() + timeout
        for name, node in sorted(self.nodes.items()):
            assert node.daemon is not None, f"{name} not started"
            node.daemon.wait_ready(max(1.0, deadline - time.monotonic()))
            self.addresses[name] = node.daemon.address

    def url(self, node: str) -> str:
        return f"http://{self.addresses[node]}" if node in self.addresses else \
            f"http://{self.spec.host}:{self.spec.node(node).port}"

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)  # its last tick may still push: close the pusher after it
        close = getattr(self.pusher, "close", None)
        if close is not None:
            close()
        for node in self.nodes.values():
            if node.daemon is not None and node.daemon.running():
                node.daemon.process.terminate()  # type: ignore[union-attr]  # all at once, then wait for each
        for node in self.nodes.values():
            if node.daemon is not None:
                node.daemon.stop(timeout=10)

    def __enter__(self) -> SimCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop ------------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return time.time() - self.started_at

    def tick(self, elapsed: float, dt: float) -> None:
        """Advance the whole cluster to simulation time ``elapsed``."""
        faults = list(self.spec.faults)
        loads: dict[str, Load] = defaultdict(Load)
        completed: list[list[tuple[RankState, dict[str, Any]]]] = []
        for job in self.jobs:
            completed.append(job.advance(elapsed, self.started_at, faults))
            busy = job.busy(elapsed)
            for state in job.ranks:
                load = loads[state.node]
                load.gpu_busy[state.local_rank] = job.gpu_busy(state.rank, elapsed)
                load.network = max(load.network, busy)
        # Steps first, as a rank pushes when it finishes one; the trees below are the slow part.
        for job, steps in zip(self.jobs, completed, strict=True):
            self._report(job, steps, elapsed)
        for collectives, steps in zip(self.collectives, completed, strict=True):
            try:
                collectives.write([record for _, record in steps])
            except OSError as exc:
                logger.error("%s: could not write its NCCL Inspector output: %s", collectives.job, exc)
        for name, node in self.nodes.items():
            node.model.tick(dt, elapsed, loads[name], faults)
        for name in self._trees_due(elapsed):
            try:
                self.nodes[name].writer.update()
            except OSError as exc:
                logger.error("%s: could not write its tree: %s", name, exc)

    def _report(self, job: JobModel, steps: list[tuple[RankState, dict[str, Any]]], elapsed: float) -> None:
        """What each rank's client sends: its completed steps, then where it is in the open step. A rank
        whose process died sends nothing more, and its process leaves its node's procfs."""
        if self.pusher is None:
            self.pusher = ClientPusher(self.url, process_of=self._process_of)
        pusher = self.pusher
        try:
            by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for state, record in steps:
                by_node[state.node].append(record)
            for node, records in by_node.items():
                pusher.steps(node, job.spec, records)
            for state in job.ranks:
                where = job.position(state.rank, elapsed)
                if where is None and (job.spec.name, state.rank) not in self._exited:
                    self._exited.add((job.spec.name, state.rank))
                    self._collectives_of(job.spec.name).exited(state.rank)
                pusher.position(state.node, job.spec, state.rank, where)
        except Exception as exc:  # a pusher bug must not stop the cluster's clock
            logger.error("%s: reporting its ranks failed: %s", job.spec.name, exc)

    def _collectives_of(self, job: str) -> StepCollectives:
        return next(c for c in self.collectives if c.job == job)

    def _process_of(self, job: str, rank: int) -> tuple[int, int] | None:
        """(pid, start time) of a simulated rank's process, as its node's procfs shows it."""
        process = self._collectives_of(job).process(rank)
        return process.pid, process.start_time

    def _trees_due(self, elapsed: float) -> list[str]:
        """Nodes whose tree is written this tick: each once per collection interval (its daemon reads
        no more often), staggered so every tick writes a share. Writing all of them every tick made a
        tick outlast its second on a busy 2-core machine, and steps reached Prometheus late."""
        interval = max(self.spec.tick, self.spec.collector_interval)
        if not self._next_tree_write:
            self._next_tree_write = {name: elapsed + i * interval / len(self.nodes)
                                     for i, name in enumerate(self.nodes)}
        due = [name for name, at in self._next_tree_write.items() if elapsed >= at]
        for name in due:
            after = self._next_tree_write[name] + interval
            self._next_tree_write[name] = after if after > elapsed else elapsed + interval  # late: no catch-up
        return due

    def start_clock(self) -> None:
        """Simulation time 0 is now: the schedule counts from when everything watching is up, not from
        :meth:`start` (daemons take a while to come up on a busy machine). :meth:`run` calls it."""
        self.started_at = time.time()
        self._clock_started = True

    def run(self, duration: float | None = None, on_tick: Callable[[float], None] | None = None) -> None:
        """Tick in real time until ``duration`` seconds of simulation time or :meth:`stop`."""
        if not self._clock_started:
            self.start_clock()
        last = self.elapsed
        while not self._stop.is_set():
            now = self.elapsed
            if duration is not None and now >= duration:
                break
            self.tick(now, max(0.0, now - last))
            if now - last > self.longest_tick_gap[0]:
                self.longest_tick_gap = (now - last, now)
            last = now
            if on_tick is not None:
                on_tick(now)
            self._stop.wait(max(0.0, self.spec.tick - (self.elapsed - now)))

    def run_in_thread(self, duration: float | None = None) -> threading.Thread:
        if not self._clock_started:
            self.start_clock()  # before the thread: callers read started_at right away
        self._thread = threading.Thread(target=self.run, args=(duration,), name="sim-ticks", daemon=True)
        self._thread.start()
        return self._thread
