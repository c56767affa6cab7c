"""NCCL Inspector output for simulated ranks: the plugin's JSON lines, from a model of synchronous collectives.

:func:`record_line` writes one record byte for byte as the plugin does
(compact JSON in the plugin's key order, integer microseconds, doubles as
C's ``%lf``, ``/`` escaped, one object per line), in the 2.28-2.29 shape or
the 2.30 one (``comm_name``, ``p2p_perf``); bandwidths are computed as the
plugin computes them.

:class:`CollectiveModel` is the timing: a collective cannot finish on any
rank before the last rank has started it. Each rank launches collective
``k`` of a step when its own work reaches that point (a gradient bucket is
ready), one collective at a time per rank (NCCL's stream), and every rank
leaves when the last one has arrived and the transfer is done. So a rank
that arrives late waits least: its execution time is the transfer alone,
its peers' is the transfer plus their wait for it. When communication
already runs back to back, a late rank's delay is hidden and nobody waits,
as on a real GPU.

:class:`InspectorNode` lays out what a node's daemon sees: one output file
per rank process (``<host>-pid<pid>.log``) and the process's procfs entries
(``status`` with its ``NSpid``, ``environ``, ``cgroup``), so the daemon's
attribution runs on them as on a real node.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Shape = Literal["2.28", "2.30"]
FORMAT_VERSION = "v4.0"  # what every shipped version writes in metadata.inspector_output_format_version
REC_MECHANISM = "nccl_profiler_interface"


def c_double(value: float) -> str:
    """C's ``%lf``: six decimals; the plugin writes NaN as the string "nan"."""
    if math.isnan(value):
        return '"nan"'
    return f"{value:.6f}"


def json_string(text: str) -> str:
    """The plugin's sanitizer: quote, backslash, slash, tab and newline escaped; no other control bytes."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("/", "\\/").replace("\t", "\\t")
    return '"' + out.replace("\n", "\\n") + '"'


def bandwidths(op: str, message_bytes: int, n_ranks: int, exec_us: int, p2p: bool = False) -> tuple[float, float]:
    """(algorithm, bus) bandwidth in GB/s, as ``inspectorComputeOpBw`` computes them."""
    seconds = exec_us / 1e6
    if p2p or op in ("Reduce", "Broadcast", "SendRecv", "Send", "Recv"):
        traffic, factor = float(message_bytes), 1.0
    elif op == "AllReduce":
        traffic, factor = float(message_bytes), 2 * (n_ranks - 1) / n_ranks
    elif op in ("ReduceScatter", "AllGather", "AllGatherV"):
        traffic, factor = float(message_bytes * n_ranks), (n_ranks - 1) / n_ranks
    else:
        traffic, factor = 0.0, 0.0
    algo = traffic / 1e9 / seconds if seconds else 0.0
    return algo, algo * factor


@dataclass(frozen=True)
class Comm:
    """One communicator as one rank sees it."""

    id: str  # "0x" + hex, the same on every rank
    rank: int
    n_ranks: int
    nnodes: int
    name: str = ""  # 2.30 on; the plugin writes "unknown" when NCCL gave none


def record_line(
    comm: Comm, op: str, sequence: int, message_bytes: int, exec_us: int, *, hostname: str, pid: int,
    dump_us: int, shape: Shape = "2.30", p2p_peer: int | None = None, timing_source: str = "kernel_gpu",
    git_rev: str = "",
) -> str:
    """One output line (with its newline) for a completed collective, or a P2P op when ``p2p_peer`` is set."""
    header = [f'"id":{json_string(comm.id)}']
    if shape == "2.30":
        header.append(f'"comm_name":{json_string(comm.name or "unknown")}')
    header += [f'"rank":{comm.rank}', f'"n_ranks":{comm.n_ranks}', f'"nnodes":{comm.nnodes}']
    metadata = (
        f'"inspector_output_format_version":"{FORMAT_VERSION}","git_rev":{json_string(git_rev)},'
        f'"rec_mechanism":"{REC_MECHANISM}","dump_timestamp_us":{dump_us},"hostname":{json_string(hostname)},'
        f'"pid":{pid}'
    )
    p2p = p2p_peer is not None
    algo, bus = bandwidths(op, message_bytes, comm.n_ranks, exec_us, p2p)
    if p2p:
        perf = (
            f'"p2p_perf":{{"p2p":{json_string(op)},"p2p_sn":{sequence},"p2p_peer":{p2p_peer},'
            f'"p2p_msg_size_bytes":{message_bytes},"p2p_exec_time_us":{exec_us},'
            f'"p2p_timing_source":{json_string(timing_source)},"p2p_algobw_gbs":{c_double(algo)},'
            f'"p2p_busbw_gbs":{c_double(bus)}}}'
        )
    else:
        perf = (
            f'"coll_perf":{{"coll":{json_string(op)},"coll_sn":{sequence},"coll_msg_size_bytes":{message_bytes},'
            f'"coll_exec_time_us":{exec_us},"coll_timing_source":{json_string(timing_source)},'
            f'"coll_algobw_gbs":{c_double(algo)},"coll_busbw_gbs":{c_double(bus)}}}'
        )
    return f'{{"header":{{{",".join(header)}}},"metadata":{{{metadata}}},{perf}}}\n'


# -- timing -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectiveSpec:
    """A collective a data-parallel step issues ``count`` times (gradient buckets), spread over backward."""

    op: str
    message_bytes: int
    count: int = 1
    bus_bandwidth: float = 150e9  # bytes/s the fabric delivers when nobody waits


@dataclass
class CollectiveModel:
    """Per-rank execution times of one step's collectives for ranks arriving at their own pace.

    ``work`` is each rank's time from the step's start to the end of its
    backward pass; bucket ``k`` of ``count`` is ready at ``(k + 1) / count``
    of it. Launch jitter and transfer noise are a few percent, as on a real
    GPU; nothing is shaped by who is late.
    """

    collectives: Sequence[CollectiveSpec]
    n_ranks: int
    launch_jitter: float = 20e-6  # seconds of kernel-launch noise per rank and collective
    transfer_noise: float = 0.03
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def transfer_seconds(self, spec: CollectiveSpec) -> float:
        _, bus_gbs = bandwidths(spec.op, spec.message_bytes, self.n_ranks, 1_000_000)
        base = bus_gbs * 1e9 / spec.bus_bandwidth  # bus bytes / delivered bus bandwidth
        return base * (1 + abs(self.rng.gauss(0, self.transfer_noise)))

    def step(self, work: Sequence[float]) -> tuple[list[list[tuple[CollectiveSpec, float]]], float]:
        """(per rank: the step's (collective, seconds) in issue order, the step's end time)."""
        per_rank: list[list[tuple[CollectiveSpec, float]]] = [[] for _ in work]
        issue = [(spec, (k + 1) / spec.count) for spec in self.collectives for k in range(spec.count)]
        issue.sort(key=lambda item: item[1])
        stream_free = [0.0] * len(work)  # when each rank's communication stream is free again
        end = 0.0
        for spec, point in issue:
            starts = [
                max(own * point + abs(self.rng.gauss(0, self.launch_jitter)), stream_free[i])
                for i, own in enumerate(work)
            ]
            end = max(starts) + self.transfer_seconds(spec)
            for i, start in enumerate(starts):
                per_rank[i].append((spec, end - start))
                stream_free[i] = end
        return per_rank, end


# -- files a node's daemon reads ------------------------------------------------------------------------


@dataclass(frozen=True)
class RankProcess:
    """One rank's process: what its output file is named after, and what procfs shows of it."""

    rank: int
    local_rank: int
    job: str
    host_pid: int
    pid: int  # as the process sees itself (differs from host_pid inside a container)
    hostname: str  # gethostname() of the process: the node, or the pod's name
    start_time: int = 0  # clock ticks after boot when it started (/proc/<pid>/stat field 22)


class InspectorNode:
    """One node's Inspector output directory and the procfs entries of its rank processes."""

    def __init__(self, dump_dir: str, procfs: str, hostname: str = "node") -> None:
        self.dump_dir = dump_dir
        self.procfs = procfs
        self.hostname = hostname  # the node's own name: what a process outside a pod gets from gethostname()
        self._files: dict[int, str] = {}  # host pid -> output path
        os.makedirs(dump_dir, exist_ok=True)

    def add_process(self, proc: RankProcess, pod_uid: str = "", slurm_job: str = "") -> None:
        """Write the process's procfs entries and create its output file.

        A pod's process (``pod_uid``) or a Slurm step's (``slurm_job``: Slurm's variables and cgroup, no
        FLEETSCOPE_JOB) or else a plain process with ``FLEETSCOPE_JOB``, ``RANK`` and ``LOCAL_RANK``.
        """
        base = os.path.join(self.procfs, str(proc.host_pid))
        os.makedirs(base, exist_ok=True)
        ns = f"{proc.host_pid}\t{proc.pid}" if proc.pid != proc.host_pid else str(proc.host_pid)
        with open(os.path.join(base, "status"), "w", encoding="utf-8") as handle:
            # The process runs as the user creating its output file (this process, here).
            uid, gid = os.getuid(), os.getgid()
            handle.write(f"Name:\tpython3\nPid:\t{proc.host_pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                         f"Gid:\t{gid}\t{gid}\t{gid}\t{gid}\nNSpid:\t{ns}\n")
        with open(os.path.join(base, "stat"), "w", encoding="utf-8") as handle:
            # Fields 3-24: state, ppid, pgrp, session, tty, tpgid, flags, faults, times, priority, nice,
            # threads, itrealvalue, starttime (22), vsize, rss.
            handle.write(f"{proc.host_pid} (python3) S 1 {proc.host_pid} {proc.host_pid} 0 -1 4194560 "
                         f"0 0 0 0 0 0 0 0 20 0 48 0 {proc.start_time} 0 0\n")
        if slurm_job:
            env = {"SLURM_JOB_ID": slurm_job, "SLURM_PROCID": str(proc.rank), "SLURM_LOCALID": str(proc.local_rank)}
            cgroup = f"0::/system.slice/slurmstepd.scope/job_{slurm_job}/step_0/user/task_{proc.local_rank}"
        else:
            env = {"RANK": str(proc.rank), "LOCAL_RANK": str(proc.local_rank), "FLEETSCOPE_JOB": proc.job}
            cgroup = (
                f"0::/kubepods.slice/kubepods-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-{'ab' * 32}.scope"
                if pod_uid else "0::/user.slice/user-1000.slice/session-3.scope"
            )
        env.update({"NCCL_INSPECTOR_ENABLE": "1", "HOSTNAME": proc.hostname})
        with open(os.path.join(base, "environ"), "wb") as raw:
            raw.write(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        with open(os.path.join(base, "cgroup"), "w", encoding="utf-8") as handle:
            handle.write(cgroup + "\n")
        path = os.path.join(self.dump_dir, f"{proc.hostname}-pid{proc.pid}.log")
        with open(path, "w"):  # the plugin creates its file with fopen("w") at its first dump
            pass
        self._files[proc.host_pid] = path

    def remove_process(self, proc: RankProcess) -> None:
        """The process exited and was reaped: its procfs entries go; its output file stays, as the plugin's does."""
        import shutil

        shutil.rmtree(os.path.join(self.procfs, str(proc.host_pid)), ignore_errors=True)

    def path_of(self, proc: RankProcess) -> str:
        return self._files[proc.host_pid]

    def append(self, proc: RankProcess, lines: Sequence[str]) -> None:
        """One dump: the plugin writes its lines and flushes (a reader may see a prefix of them)."""
        with open(self._files[proc.host_pid], "a", encoding="utf-8") as handle:
            handle.write("".join(lines))


def comm_id(seed: int) -> str:
    """A communicator hash as the plugin prints it (``0x%lx``)."""
    return f"0x{random.Random(seed).getrandbits(60) | (1 << 56):x}"


def round_us(seconds: float) -> int:
    return max(0, math.floor(seconds * 1e6))


# -- a job that trains while its output is read --------------------------------------------------------


@dataclass
class InspectorJob:
    """A data-parallel job writing Inspector output in real time: ``ranks_per_node`` ranks on each node.

    Every rank is one process with its own file; all ranks share one communicator spanning the nodes.
    Each step, every rank works ``step_work`` seconds (a few percent of jitter; a rank in ``slow`` times
    its factor, as a throttled GPU or a slow input pipeline would), issuing its collectives as gradient
    buckets fill; :class:`CollectiveModel` gives each rank's execution times. :meth:`advance` runs the
    steps that fit in the wall-clock time since the last call and writes them as one dump per rank.
    ``pods``: each rank runs in a pod (hostname ``<job>-worker-<rank>``, pid 1 inside the container).
    """

    name: str
    nodes: Sequence[InspectorNode]
    ranks_per_node: int
    collectives: Sequence[CollectiveSpec]
    step_work: float = 0.2
    step_overhead: float = 0.01  # optimizer and host time after the last collective
    jitter: float = 0.02
    slow: dict[int, float] = field(default_factory=dict)
    pods: bool = False
    shape: Shape = "2.30"
    seed: int = 1
    _procs: list[tuple[InspectorNode, RankProcess]] = field(default_factory=list)
    _sequence: int = 0
    _clock: float = 0.0
    _rng: random.Random = field(default_factory=random.Random)
    _model: CollectiveModel | None = None
    _comm: str = ""

    def start(self, now: float, first_pid: int) -> None:
        for index, node in enumerate(self.nodes):
            for local in range(self.ranks_per_node):
                rank = index * self.ranks_per_node + local
                host_pid = first_pid + rank
                proc = RankProcess(
                    rank, local, self.name, host_pid=host_pid, pid=1 if self.pods else host_pid,
                    hostname=f"{self.name}-worker-{rank}" if self.pods else node.hostname,
                )
                pod_uid = f"00000000-0000-4000-8000-{self.seed:06d}{rank:06d}" if self.pods else ""
                node.add_process(proc, pod_uid=pod_uid)
                self._procs.append((node, proc))
        self._rng = random.Random(self.seed)
        self._model = CollectiveModel(self.collectives, len(self._procs), rng=random.Random(self.seed + 1))
        self._comm = comm_id(self.seed)
        self._clock = now

    def advance(self, now: float) -> int:
        """Run the steps that end by ``now``; returns how many."""
        lines: list[list[str]] = [[] for _ in self._procs]
        steps = 0
        while True:
            work = [
                self.step_work * (1 + self._rng.gauss(0, self.jitter)) * self.slow.get(proc.rank, 1.0)
                for _, proc in self._procs
            ]
            assert self._model is not None, "start() first"
            per_rank, end = self._model.step(work)
            if self._clock + end + self.step_overhead > now:
                break  # this step has not finished yet: it runs again, drawn afresh, next time
            self._clock += end + self.step_overhead
            steps += 1
            dump_us = int(self._clock * 1e6)
            for i, (_, proc) in enumerate(self._procs):
                comm = Comm(self._comm, proc.rank, len(self._procs), len(self.nodes), "default_pg")
                for k, (spec, seconds) in enumerate(per_rank[i]):
                    lines[i].append(record_line(
                        comm, spec.op, self._sequence + k + 1, spec.message_bytes, round_us(seconds),
                        hostname=proc.hostname, pid=proc.pid, dump_us=dump_us, shape=self.shape))
            self._sequence += len(per_rank[0])
        for i, (node, proc) in enumerate(self._procs):
            if lines[i]:
                node.append(proc, lines[i])
        return steps


# -- the simulated cluster's jobs ------------------------------------------------------------------------

RANK_PID_BASE = 40000  # a simulated rank's process id on its node: this + its local rank (the GPU's process too)


def rank_pid(local_rank: int) -> int:
    return RANK_PID_BASE + local_rank


@dataclass
class StepCollectives:
    """The Inspector output of one simulated job's ranks, from the very steps their step records report.

    A data-parallel job (DDP): one communicator over all ranks, the gradients all-reduced in ``buckets``
    buckets of ``bucket_bytes`` (DDP's default 25 MiB) as backward fills them. A rank's own work in a
    step is its data wait plus its compute, as its step record says; :class:`CollectiveModel` turns the
    ranks' work into their collective times, so a rank that arrives late (a slow GPU, a slow loader)
    has the shortest and its peers wait. The transfers together take the job's communication share of
    a typical step (``transfer_seconds``). A rank that makes no step writes nothing, as NCCL records
    only completed collectives.
    """

    job: str
    nodes: Sequence[tuple[str, InspectorNode]]  # (node name, its Inspector directory), in the job's rank order
    ranks_per_node: int
    transfer_seconds: float
    buckets: int = 4
    bucket_bytes: int = 25 << 20
    seed: int = 1
    _procs: dict[int, tuple[InspectorNode, RankProcess]] = field(default_factory=dict)
    _model: CollectiveModel | None = None
    _comm: str = ""
    _sequence: int = 0

    def start(self, start_ticks: Mapping[str, int] | None = None) -> None:
        """Create every rank's procfs entries and (empty) output file.

        ``start_ticks``: per node, clock ticks after its boot when the job's processes started.
        """
        for index, (name, node) in enumerate(self.nodes):
            for local in range(self.ranks_per_node):
                rank = index * self.ranks_per_node + local
                pid = rank_pid(local)
                started = (start_ticks or {}).get(name, 0) + local  # the launcher starts them a tick apart
                proc = RankProcess(rank, local, self.job, host_pid=pid, pid=pid, hostname=name, start_time=started)
                node.add_process(proc)
                self._procs[rank] = (node, proc)
        world = len(self._procs)
        _, bus_gbs = bandwidths("AllReduce", self.bucket_bytes, world, 1_000_000)
        per_bucket = self.transfer_seconds / self.buckets
        spec = CollectiveSpec("AllReduce", self.bucket_bytes, self.buckets, bus_bandwidth=bus_gbs * 1e9 / per_bucket)
        self._model = CollectiveModel([spec], world, rng=random.Random(self.seed))
        self._comm = comm_id(self.seed)

    def process(self, rank: int) -> RankProcess:
        """The rank's process: what its client reports as its pid and start time."""
        return self._procs[rank][1]

    def exited(self, rank: int) -> None:
        """The rank's process died: it is gone from its node's procfs."""
        node, proc = self._procs[rank]
        node.remove_process(proc)

    def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        """One dump per rank for the steps in ``records`` (step records as the job pushes them)."""
        assert self._model is not None, "start() first"
        by_step: dict[int, list[Mapping[str, Any]]] = {}
        for record in records:
            by_step.setdefault(int(record["step"]), []).append(record)
        lines: dict[int, list[str]] = {}
        world, nnodes = len(self._procs), len(self.nodes)
        for step in sorted(by_step):
            group = by_step[step]
            work = [float(r["data_seconds"]) + float(r["compute_seconds"]) for r in group]
            per_rank, _ = self._model.step(work)
            dump_us = int(max(float(r["timestamp"]) for r in group) * 1e6)
            for record, collectives in zip(group, per_rank, strict=True):
                _, proc = self._procs[int(record["rank"])]
                comm = Comm(self._comm, proc.rank, world, nnodes, "default_pg")
                lines.setdefault(proc.rank, []).extend(
                    record_line(comm, spec.op, self._sequence + k + 1, spec.message_bytes, round_us(seconds),
                                hostname=proc.hostname, pid=proc.pid, dump_us=dump_us)
                    for k, (spec, seconds) in enumerate(collectives))
            self._sequence += self.buckets
        for rank, rank_lines in lines.items():
            node, proc = self._procs[rank]
            node.append(proc, rank_lines)
