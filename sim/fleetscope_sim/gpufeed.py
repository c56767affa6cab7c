"""Feed a node process's NVML fake from the simulator's ``gpu.json``.

The simulator (another process) owns the GPU model; this side turns each new
state file into the fake's units (mW, mJ, MHz, ns, percent), delivers newly
logged Xids as NVML events and marks lost GPUs lost, so the real GPU
collector and the real ``pynvml`` binding see a moving, faulting node.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from fleetscope.sources.nvml_h import EVENT_DOUBLE_BIT_ECC
from fleetscope_sim.inspector import rank_pid
from fleetscope_sim.tree import NodePaths

logger = logging.getLogger(__name__)

PCI_DEVICE_IDS = {"hopper": 0x233010DE, "ampere": 0x20B010DE}


class GpuFeed:
    """Owns one installed :class:`~fleetscope_sim.nvml_fake.FakeNvml` and keeps it in step with ``gpu.json``."""

    def __init__(self, paths: NodePaths, poll: float = 0.5) -> None:
        self.paths = paths
        self.poll = poll
        self.fake: Any = None
        self.binding: Any = None  # the node's own pynvml module, when installed privately
        self._mtime = 0.0
        self._xids_seen: dict[int, int] = {}
        self._uncorrected: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self, force: bool = False) -> dict[str, Any] | None:
        try:
            mtime = os.stat(self.paths.gpu_state).st_mtime
            if mtime == self._mtime and not force:
                return None
            with open(self.paths.gpu_state, encoding="utf-8") as handle:
                data: dict[str, Any] = json.load(handle)
            self._mtime = mtime
            return data
        except (OSError, ValueError) as exc:
            logger.warning("cannot read %s: %s", self.paths.gpu_state, exc)
            return None

    def install(self, private: bool = False) -> Any:
        """Build the fake from the current state file and install it as ``pynvml``'s library (``private``: as
        the library of a copy of ``pynvml`` of its own, kept in :attr:`binding`, for one of many nodes in one
        process)."""
        from fleetscope_sim.nvml_fake import FakeGpu, FakeNvml, install, private_binding, write_sysfs

        state = self._read()
        if state is None:
            raise FileNotFoundError(self.paths.gpu_state)
        arch = state["architecture"]
        gpus = []
        for g in state["gpus"]:
            domain, bus, rest = g["bus_id"].split(":")
            max_clocks = {"sm": state["sm_clock_max_mhz"], "graphics": state["sm_clock_max_mhz"],
                          "memory": state["mem_clock_max_mhz"]}
            gpus.append(FakeGpu(
                index=g["index"], name=state["name"], uuid=g["uuid"], serial=g["serial"],
                pci_domain=int(domain, 16), pci_bus=int(bus, 16), pci_device=int(rest.split(".")[0], 16),
                pci_device_id=PCI_DEVICE_IDS.get(arch, 0x233010DE), architecture=arch,
                memory_total=state["memory_total_bytes"], slowdown_temperature=state["slowdown_temp_c"],
                shutdown_temperature=state["shutdown_temp_c"], power_limit_mw=int(state["power_limit_w"] * 1000),
                max_clocks_mhz=max_clocks, clocks_mhz=dict(max_clocks),
                gpm=None if arch != "hopper" else {"sm_active": 0.0, "sm_occupancy": 0.0, "tensor_active": 0.0,
                                                   "dram_active": 0.0},
            ))
        self.fake = FakeNvml(gpus, name="fleetscope-sim")
        if private:
            self.binding = private_binding(self.fake)
        else:
            install(self.fake)
        write_sysfs(self.fake, self.paths.sysfs)
        self._apply(state)
        return self.fake

    def _apply(self, state: dict[str, Any]) -> None:
        for g in state["gpus"]:
            gpu = self.fake.gpu(g["index"])
            busy = g["utilization"]
            gpu.set(
                utilization_gpu=round(busy * 100), utilization_memory=round(g["memory_utilization"] * 100),
                memory_used=g["memory_used_bytes"], temperature=round(g["temperature_c"]),
                memory_temperature=round(g["memory_temperature_c"]), power_mw=int(g["power_w"] * 1000),
                energy_mj=int(g["energy_j"] * 1000),
                clocks_mhz={"sm": int(g["sm_clock_mhz"]), "graphics": int(g["sm_clock_mhz"]),
                            "memory": int(g["mem_clock_mhz"])},
                throttle_ns={r: int(s * 1e9) for r, s in g["throttle_seconds"].items() if r in gpu.throttle_ns},
                ecc={"corrected_volatile": g["ecc_corrected"], "uncorrected_volatile": g["ecc_uncorrected"],
                     "corrected_aggregate": g["ecc_corrected"], "uncorrected_aggregate": g["ecc_uncorrected"]},
                remapped_rows={"correctable": g["remapped_correctable"], "uncorrectable": g["remapped_uncorrectable"],
                               "pending": int(g["remap_pending"]), "failure": int(g["remap_failed"])},
                pcie_replays=g["pcie_replays"],
                performance_state=0 if busy > 0.05 else 8,
                processes=[(rank_pid(g["index"]), g["memory_used_bytes"])] if busy > 0.05 else [],
            )
            if gpu.gpm is not None:
                # GPM metrics are percentages, like NVML's.
                gpu.set(gpm={"sm_active": 90.0 * busy, "sm_occupancy": 40.0 * busy, "tensor_active": 55.0 * busy,
                             "dram_active": 50.0 * busy})
            gpu.throttle(*g["throttle"])
            if g["ecc_uncorrected"] > self._uncorrected.get(g["index"], 0):
                # NVML posts a double-bit ECC event with the error: the daemon reads the GPU's ECC counters at once
                self.fake.inject_event(g["index"], EVENT_DOUBLE_BIT_ECC)
            self._uncorrected[g["index"]] = g["ecc_uncorrected"]
            seen = self._xids_seen.get(g["index"], 0)
            for xid in g["xids"][seen:]:
                self.fake.inject_xid(g["index"], xid)
            self._xids_seen[g["index"]] = len(g["xids"])
            if g["lost"] and not gpu.lost:
                self.fake.lose(g["index"])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sim-gpu-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def refresh(self, force: bool = False) -> bool:
        """Apply the state file if it changed since the last look (``force``: whatever its mtime says); True if
        it was applied."""
        state = self._read(force)
        if state is None:
            return False
        try:
            self._apply(state)
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("bad GPU state in %s: %s", self.paths.gpu_state, exc)
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            self.refresh()
