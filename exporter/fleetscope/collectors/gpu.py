"""The ``gpu`` collector: NVML telemetry, GPUs on the PCI bus, Xids from NVML and the kernel log, job attribution.

Importing this module never loads ``pynvml``: the NVML source imports it on
the first collection. Each part fails alone: no NVML library still leaves the
PCI count and kernel-log Xids (exactly when Xid 79 matters); an unreadable
kernel log leaves NVML. Only a node with neither NVML nor an NVIDIA GPU on
the PCI bus is "no hardware".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.core import Metric

from fleetscope.collectors.protocol import Closeable, Collector, Finding, HealthCheck
from fleetscope.config import Config
from fleetscope.errors import Incomplete, NoHardware, SourceError
from fleetscope.metrics import gpu
from fleetscope.metrics.detail import Detail
from fleetscope.metrics.families import FamilyBuilder
from fleetscope.sources.fs import Root
from fleetscope.sources.gpu_jobs import JobAttribution, attribute, attribute_pids
from fleetscope.sources.kmsg import KmsgReader, boot_time
from fleetscope.sources.nvml import GpuIdentity, GpuSample, NvmlReading, NvmlSource
from fleetscope.sources.nvml_h import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_IN_PROGRESS,
    FABRIC_STATE_NOT_STARTED,
    RETURN_CODES,
)
from fleetscope.sources.pci import PciGpu, list_gpus
from fleetscope.sources.podresources import Allocation
from fleetscope.sources.xid import (
    OTHER_GPU,
    PciAddress,
    XidLedger,
    XidSighting,
    is_fatal,
    xid_action,
    xid_label,
)

logger = logging.getLogger(__name__)
MAX_ANNOUNCED_GPUS = 64  # "NVRM: GPU at PCI:..." lines remembered (a node has at most a few dozen GPUs)

# What every NVIDIA GPU since Kepler answers, MIG or not: a GPU with none of them is one fleetscope cannot see.
BASICS = frozenset({"memory_used", "temperature", "power"})
RECOVERY_ACTIONS = {1: "GPU reset required", 2: "node reboot required", 3: "drain P2P", 4: "drain and reset"}


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything one collection learned; metrics and health findings are both built from it."""

    nvml: NvmlReading | None
    nvml_error: str
    pci_gpus: tuple[PciGpu, ...]
    xid_counts: Mapping[tuple[PciAddress, int], int]
    xid_last: Mapping[PciAddress, float]
    recent_xids: tuple[XidSighting, ...]
    jobs: Mapping[int, tuple[JobAttribution, ...]]
    labels_by_pci: Mapping[PciAddress, tuple[str, str]] = field(default_factory=dict)
    mig_jobs: Mapping[tuple[int, int], tuple[JobAttribution, ...]] = field(default_factory=dict)  # (gpu, instance)
    allocations: tuple[Allocation, ...] = ()  # the kubelet's, when gpu.pod-resources-socket is set
    allocation_error: str = ""  # why the kubelet could not be asked ("" when it answered or is not asked)


class GpuCollector(Collector, HealthCheck, Closeable):
    name = "gpu"
    tables = gpu.TABLES

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, nvml_binding: Any = None) -> None:
        """``clock`` paces NVML's slow reads and retries (a benchmark steps it instead of waiting); ``wall`` is
        the Unix clock of Xid events; ``nvml_binding`` a loaded ``pynvml`` module in place of the imported one
        (the virtual-time simulator gives each simulated node its own)."""
        self.config = config
        self._wall = wall
        self._sysfs = Root(config.path.sysfs)
        self._procfs = Root(config.path.procfs)
        self._jobs_dir = Root(config.gpu.jobs_dir)
        self._ledger = XidLedger()
        self.detail = Detail(config.collector(self.name).detail)
        self._nvml = NvmlSource(
            lost_retry=config.gpu.lost_retry, on_xid=self._ledger.record, slow_interval=config.gpu.slow_interval,
            unsupported_retry=config.gpu.unsupported_retry, per_link=self.detail.level == "all",
            pcie_sampler=config.gpu.pcie_sampler, clock=clock, binding=nvml_binding, wall=wall,
        )
        self._kmsg: KmsgReader | None = None
        self._kmsg_failed = False
        self._kmsg_uuids: dict[PciAddress, str] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._allocations: tuple[Allocation, ...] = ()
        self._allocation_error = ""
        self._allocations_read: float | None = None  # when the kubelet was last asked

    # -- reading -----------------------------------------------------------------------------------

    def _read_kmsg(self, gpus: set[PciAddress]) -> None:
        """New kernel-log Xids into the ledger; an address that is none of ``gpus`` (nor announced by the
        driver) counts under :data:`OTHER_GPU`, so the keys stay bounded by the node's GPUs (#35 item 6)."""
        if not self.config.gpu.kmsg:
            return
        if self._kmsg is None:
            # A quarter of the collection's time (2 s by default) for the kernel log: a full ring buffer on a
            # loaded node is read in part, the rest at the next poll, and `check` still answers in time.
            budget = self.config.collector(self.name).timeout / 4
            self._kmsg = KmsgReader(self.config.path.kmsg, boot_time(self._procfs), budget=budget)
        try:
            batch = self._kmsg.poll()
        except SourceError as exc:
            if not self._kmsg_failed:
                logger.warning("kernel log unreadable, Xids from NVML events only: %s", exc)
            self._kmsg_failed = True
            self._kmsg.close()
            self._kmsg = None
            return
        self._kmsg_failed = False
        if self._kmsg.behind:
            logger.warning("kernel log: read for %.1f s and stopped short of its end; the rest is read next time",
                           self._kmsg.budget)
        for pci, uuid in batch.uuids.items():
            if pci in self._kmsg_uuids or len(self._kmsg_uuids) < MAX_ANNOUNCED_GPUS:
                self._kmsg_uuids[pci] = uuid
        known = gpus | self._kmsg_uuids.keys()
        for xid in batch.xids:
            pci = xid.pci if xid.pci in known else OTHER_GPU
            self._ledger.record(XidSighting(pci, xid.xid, xid.timestamp, "kmsg_fallen" if xid.multiline else "kmsg",
                                            xid.message))

    def snapshot(self) -> GpuSnapshot:
        with self._lock:
            pci_gpus = tuple(list_gpus(self._sysfs))
            nvml: NvmlReading | None = None
            nvml_error = ""
            try:
                nvml = self._nvml.read()
            except NoHardware as exc:
                nvml_error = str(exc)
            self._read_kmsg(set(self._labels_by_pci(nvml, pci_gpus)))
            labels = self._labels_by_pci(nvml, pci_gpus)  # with the uuids the driver's log just announced
            jobs: dict[int, tuple[JobAttribution, ...]] = {}
            mig_jobs: dict[tuple[int, int], tuple[JobAttribution, ...]] = {}
            if nvml is not None:
                pids = {s.identity.index: [p.pid for p in s.processes] for s in nvml.samples}
                uuids = {s.identity.index: s.identity.uuid for s in nvml.samples}
                jobs = attribute(self._procfs, self._jobs_dir, pids, uuids)
                for (index, instance), instance_pids in _instance_pids(nvml.samples).items():
                    found = attribute_pids(self._procfs, instance_pids)
                    if found:
                        mig_jobs[(index, instance)] = found
            self._read_allocations()
            cutoff = self._wall() - self.config.gpu.xid_window
            return GpuSnapshot(
                nvml, nvml_error, pci_gpus, self._ledger.counts(), self._ledger.last_timestamps(),
                tuple(self._ledger.since(cutoff)), jobs, labels, mig_jobs, self._allocations,
                self._allocation_error,
            )

    def _read_allocations(self) -> None:
        """Ask the kubelet which pod holds each GPU, at the slow interval (allocations change with pods, not
        with load). A failure is kept as the collection's blind spot until the next read; never raised."""
        socket = self.config.gpu.pod_resources_socket
        now = self._clock()
        if not socket or (self._allocations_read is not None
                          and now - self._allocations_read < self.config.gpu.slow_interval):
            return
        from fleetscope.sources import podresources

        self._allocations_read = now
        try:
            self._allocations = podresources.read(socket, self.config.collector(self.name).timeout / 4)
        except SourceError as exc:
            if str(exc) != self._allocation_error:
                logger.warning("GPU pod attribution unavailable: %s", exc)
            self._allocations, self._allocation_error = (), str(exc)
            return
        self._allocation_error = ""

    def _labels_by_pci(
        self, nvml: NvmlReading | None, pci_gpus: tuple[PciGpu, ...]
    ) -> dict[PciAddress, tuple[str, str]]:
        """(gpu, uuid) labels for a PCI address: NVML's identity, else PCI bus order (NVML's own enumeration order)."""
        out: dict[PciAddress, tuple[str, str]] = {}
        for position, pci_gpu in enumerate(pci_gpus):
            out[pci_gpu.pci] = (str(position), self._kmsg_uuids.get(pci_gpu.pci, ""))
        if nvml is not None:
            for identity in [s.identity for s in nvml.samples] + list(nvml.lost):
                if identity.pci is not None:
                    out[identity.pci] = (str(identity.index), identity.uuid)
        return out

    def _gpu_labels(self, snapshot: GpuSnapshot, pci: PciAddress) -> tuple[str, str]:
        if pci == OTHER_GPU:
            return ("other", "")
        return snapshot.labels_by_pci.get(pci, (str(pci), self._kmsg_uuids.get(pci, "")))

    def _lost_identity(self, identity: GpuIdentity, snapshot: GpuSnapshot) -> GpuIdentity:
        """A GPU lost before NVML ever told us its UUID: take it from the kernel log via PCI order."""
        if identity.uuid or identity.index >= len(snapshot.pci_gpus):
            return identity
        pci = snapshot.pci_gpus[identity.index].pci
        return GpuIdentity(identity.index, uuid=self._kmsg_uuids.get(pci, ""), pci=pci,
                           pci_bus_id=snapshot.pci_gpus[identity.index].address)

    # -- metrics -----------------------------------------------------------------------------------

    def _absent(self, snapshot: GpuSnapshot) -> bool:
        """No GPU here at all, and none expected: no NVML, none on the PCI bus, no Xid ever logged (else the GPUs
        are gone), and no ``gpu.expected-count`` (a node that should have GPUs and shows none is the fault that
        count exists for: a driver that failed to load)."""
        return (snapshot.nvml is None and not snapshot.pci_gpus and not snapshot.xid_counts
                and not self.config.gpu.expected_count)

    def collect(self) -> list[Metric]:
        snapshot = self.snapshot()
        if self._absent(snapshot):
            raise NoHardware(snapshot.nvml_error or "no NVIDIA GPU on the PCI bus")
        families = self._families(snapshot)
        blind = "; ".join(filter(None, (self._blind(snapshot), snapshot.allocation_error)))
        if blind:
            raise Incomplete(blind, families)
        return families

    @staticmethod
    def _blind(snapshot: GpuSnapshot) -> str:
        """What NVML should have answered and did not ("" when nothing): the collector then reports failure."""
        nvml = snapshot.nvml
        if nvml is None:
            return f"{snapshot.nvml_error or 'NVML unavailable'}; {len(snapshot.pci_gpus)} NVIDIA GPUs on the PCI bus"
        silent = [str(s.identity.index) for s in nvml.samples if not BASICS & set(s.scalars)]
        if silent:
            return f"NVML answered none of {', '.join(sorted(BASICS))} for GPU {', '.join(silent)}"
        return ""

    def _families(self, snapshot: GpuSnapshot) -> list[Metric]:
        builder = self.detail.builder()
        nvml = snapshot.nvml
        if nvml is not None:
            builder.add(gpu.NVML_DEVICES, (), nvml.device_count)
            builder.add_info(gpu.DRIVER_INFO, (), {
                "driver_version": nvml.driver_version, "nvml_version": nvml.nvml_version})
            for sample in nvml.samples:
                self._add_identity(builder, sample.identity)
                labels = (str(sample.identity.index), sample.identity.uuid)
                builder.add(gpu.LOST, labels, 0)
                for key, value in sample.scalars.items():
                    builder.add(gpu.NVML_TABLE[key], labels, value)
                for key, values in sample.labelled.items():
                    for extra, value in values.items():
                        builder.add(gpu.NVML_TABLE[key], labels + extra, value)
                fabric = sample.fabric
                if fabric is not None and fabric.state == FABRIC_STATE_COMPLETED:
                    builder.add_info(gpu.FABRIC_INFO, labels, {"clique_id": str(fabric.clique_id),
                                                               "cluster_uuid": fabric.cluster_uuid})
                for device in sample.mig:
                    builder.add_info(gpu.MIG_INFO, (*labels, str(device.gpu_instance), str(device.compute_instance)),
                                     {"mig_uuid": device.uuid, "name": device.name})
            for lost in nvml.lost:
                identity = self._lost_identity(lost, snapshot)
                self._add_identity(builder, identity)
                builder.add(gpu.LOST, (str(identity.index), identity.uuid), 1)
        builder.add(gpu.PCI_DEVICES, (), len(snapshot.pci_gpus))
        if self.config.gpu.expected_count > 0:
            builder.add(gpu.EXPECTED_DEVICES, (), self.config.gpu.expected_count)
        for (pci, xid), count in sorted(snapshot.xid_counts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            builder.add(gpu.XID_ERRORS_TOTAL, (*self._gpu_labels(snapshot, pci), xid_label(xid), xid_action(xid)),
                        count)
        for pci, stamp in snapshot.xid_last.items():
            builder.add(gpu.LAST_XID_TIMESTAMP_SECONDS, self._gpu_labels(snapshot, pci), stamp)
        if nvml is not None:
            uuids = {s.identity.index: s.identity.uuid for s in nvml.samples}
            for index, jobs in snapshot.jobs.items():
                for job in jobs:
                    builder.add_info(gpu.JOB_INFO, (str(index), uuids.get(index, "")), asdict(job))
            for (index, instance), jobs in sorted(snapshot.mig_jobs.items()):
                for job in jobs:
                    builder.add_info(gpu.MIG_JOB_INFO, (str(index), uuids.get(index, ""), str(instance)), asdict(job))
            devices = {s.identity.uuid: s.identity for s in nvml.samples if s.identity.uuid}
            devices.update({d.uuid: s.identity for s in nvml.samples for d in s.mig if d.uuid})
            for allocation in snapshot.allocations:
                holder = devices.get(allocation.device)
                if holder is not None:  # a device id none of the GPUs NVML sees has no gpu label to carry
                    builder.add_info(gpu.ALLOCATION_INFO, (str(holder.index), holder.uuid), asdict(allocation))
        return builder.families()

    @staticmethod
    def _add_identity(builder: FamilyBuilder, identity: GpuIdentity) -> None:
        builder.add_info(gpu.INFO, (str(identity.index), identity.uuid), {
            "name": identity.name, "serial": identity.serial, "pci_bus_id": identity.pci_bus_id,
            "vbios_version": identity.vbios_version, "mig_mode": identity.mig_mode,
            "architecture": identity.architecture,
        })

    # -- health ------------------------------------------------------------------------------------

    def health(self) -> list[Finding]:
        snapshot = self.snapshot()
        if self._absent(snapshot):
            raise NoHardware(snapshot.nvml_error or "no NVIDIA GPU on the PCI bus")
        return findings(snapshot, self.config.gpu.expected_count, self.config.gpu.xid_window,
                        lambda pci: self._gpu_labels(snapshot, pci)[0])

    def close(self) -> None:
        self._nvml.close()
        if self._kmsg is not None:
            self._kmsg.close()
            self._kmsg = None


def findings(snapshot: GpuSnapshot, expected: int, xid_window: float, gpu_of: Any) -> list[Finding]:
    """Health verdicts: missing or lost GPUs, fatal Xids, ECC, row remapping, recovery action, NVLink down."""
    out: list[Finding] = []

    def bad(subject: str, message: str) -> None:
        out.append(Finding("gpu", "unhealthy", subject, message))

    nvml = snapshot.nvml
    pci_count = len(snapshot.pci_gpus)
    if expected and nvml is None and not pci_count:
        bad("node", f"no GPU visible, {expected} expected: none on the PCI bus, NVML "
            f"{snapshot.nvml_error or 'unavailable'}")
    elif expected and pci_count < expected:
        bad("node", f"{pci_count} of {expected} expected GPUs on the PCI bus")
    if nvml is None:
        if pci_count:
            bad("node", f"NVML unavailable with {pci_count} NVIDIA GPUs on the PCI bus: {snapshot.nvml_error}")
    else:
        if nvml.device_count < max(pci_count, expected):
            bad("node", f"NVML sees {nvml.device_count} GPUs, {max(pci_count, expected)} expected")
        for identity in nvml.lost:
            bad(f"gpu {identity.index}", "lost (NVML: GPU is lost; fallen off the bus?)")
        for sample in nvml.samples:
            subject = f"gpu {sample.identity.index}"
            ecc = sample.labelled.get("ecc_errors", {})
            if ecc.get(("uncorrected", "volatile"), 0) > 0:
                bad(subject, f"{ecc[('uncorrected', 'volatile')]:.0f} uncorrectable ECC errors since driver load")
            if sample.scalars.get("row_remap_pending", 0) > 0:
                bad(subject, "row remap pending: reset the GPU")
            if sample.scalars.get("row_remap_failed", 0) > 0:
                bad(subject, "row remapping failed")
            if sample.scalars.get("retired_pages_pending", 0) > 0:
                bad(subject, "page retirement pending: reload the driver")
            action = int(sample.scalars.get("recovery_action", 0))
            if action:
                bad(subject, f"driver recovery action: {RECOVERY_ACTIONS.get(action, action)}")
            down = [link for (link,), up in sample.labelled.get("nvlink_up", {}).items() if up == 0]
            if down:
                bad(subject, f"NVLink down: link {', '.join(sorted(down, key=int))}")
            out.extend(_fabric_findings(sample, subject))
    fatal: dict[tuple[str, int], int] = {}
    for sighting in snapshot.recent_xids:
        if is_fatal(sighting.xid):
            key = (str(gpu_of(sighting.pci)), sighting.xid)
            fatal[key] = fatal.get(key, 0) + 1
    for (index, xid), count in sorted(fatal.items()):
        bad(f"gpu {index}", f"Xid {xid} ({xid_action(xid)}) x{count} in the last {xid_window:.0f}s")
    return out


def _instance_pids(samples: tuple[GpuSample, ...]) -> dict[tuple[int, int], list[int]]:
    """(GPU, MIG GPU instance) -> the pids NVML places in that instance."""
    out: dict[tuple[int, int], list[int]] = {}
    for sample in samples:
        for process in sample.processes:
            if process.gpu_instance is not None:
                out.setdefault((sample.identity.index, process.gpu_instance), []).append(process.pid)
    return out


def _fabric_findings(sample: GpuSample, subject: str) -> list[Finding]:
    """The GPU's NVLink fabric registration: a GPU Fabric Manager has not registered cannot run CUDA (error 802).
    State NOT_SUPPORTED (no NVSwitch fabric) and no answer at all (PCIe boards, older drivers) are no finding."""
    fabric = sample.fabric
    if fabric is None:
        return []
    if fabric.state == FABRIC_STATE_NOT_STARTED:
        return [Finding("gpu", "unhealthy", subject, "not registered with the NVLink fabric (state not started): "
                        "is nvidia-fabricmanager running? CUDA fails to initialise until it registers the GPU")]
    if fabric.state == FABRIC_STATE_IN_PROGRESS:
        return [Finding("gpu", "warning", subject, "NVLink fabric registration in progress")]
    if fabric.state == FABRIC_STATE_COMPLETED and fabric.status:
        name = RETURN_CODES.get(fabric.status, (f"error {fabric.status}", b""))[0]
        return [Finding("gpu", "unhealthy", subject, f"NVLink fabric registration failed: {name}")]
    return []
