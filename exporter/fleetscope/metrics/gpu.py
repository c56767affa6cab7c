"""NVIDIA GPUs: NVML telemetry and health, GPUs on the PCI bus, Xid errors, and which job uses which GPU.

Four tables, one per raw source, all exported by the ``gpu`` collector. The
NVML table is keyed by the names of the NVML reader's values
(:data:`fleetscope.sources.nvml.NvmlValue`), whose ``scale`` turns NVML's
units (percent, mW, mJ, MHz, ns, KB/s) into base units.
"""

from __future__ import annotations

from fleetscope.metrics.spec import AtDefault, MetricKind, MetricSpec, table

PREFIX = "fleetscope_gpu_"
_GPU = ("gpu", "uuid")


def _g(
    name: str, help: str, raw: str, unit: str = "", scale: float = 1.0, labels: tuple[str, ...] = (),
    at_default: AtDefault | None = None,
) -> MetricSpec:
    kind: MetricKind = "counter" if name.endswith("_total") else "gauge"
    return MetricSpec(name, kind, help, _GPU + labels, unit=unit, raw=raw, scale=scale, at_default=at_default)


# -- NVML -------------------------------------------------------------------------------------------

INFO = MetricSpec(
    "fleetscope_gpu_info", "info", "Static facts of the GPU (the node's driver: fleetscope_gpu_driver_info).", _GPU,
    raw="nvmlDeviceGetName/Serial/PciInfo/VbiosVersion/MigMode/Architecture",
    info_keys=("name", "serial", "pci_bus_id", "vbios_version", "mig_mode", "architecture"))
DRIVER_INFO = MetricSpec(
    "fleetscope_gpu_driver_info", "info", "The node's NVIDIA driver and NVML versions.",
    raw="nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion", info_keys=("driver_version", "nvml_version"))
UTILIZATION_RATIO = _g(
    "fleetscope_gpu_utilization_ratio",
    "Share of the last sample period in which a kernel ran (not supported with MIG).",
    "nvmlDeviceGetUtilizationRates.gpu", "ratio", 0.01)
MEMORY_UTILIZATION_RATIO = _g(
    "fleetscope_gpu_memory_utilization_ratio",
    "Share of the last sample period in which device memory was read or written.",
    "nvmlDeviceGetUtilizationRates.memory", "ratio", 0.01)
MEMORY_USED_BYTES = _g(
    "fleetscope_gpu_memory_used_bytes", "Device memory allocated.", "nvmlDeviceGetMemoryInfo_v2.used", "bytes")
MEMORY_FREE_BYTES = _g(
    "fleetscope_gpu_memory_free_bytes", "Device memory free.", "nvmlDeviceGetMemoryInfo_v2.free", "bytes")
MEMORY_TOTAL_BYTES = _g(
    "fleetscope_gpu_memory_total_bytes", "Device memory installed.", "nvmlDeviceGetMemoryInfo_v2.total", "bytes")
MEMORY_RESERVED_BYTES = _g(
    "fleetscope_gpu_memory_reserved_bytes",
    "Device memory reserved by the driver (absent on drivers without nvmlDeviceGetMemoryInfo_v2).",
    "nvmlDeviceGetMemoryInfo_v2.reserved", "bytes")
TEMPERATURE_CELSIUS = _g(
    "fleetscope_gpu_temperature_celsius", "GPU die temperature.",
    "nvmlDeviceGetTemperatureV(NVML_TEMPERATURE_GPU)", "celsius")
MEMORY_TEMPERATURE_CELSIUS = _g(
    "fleetscope_gpu_memory_temperature_celsius", "HBM temperature.", "NVML_FI_DEV_MEMORY_TEMP", "celsius")
SLOWDOWN_TEMPERATURE_CELSIUS = _g(
    "fleetscope_gpu_slowdown_temperature_celsius", "Temperature at which the GPU starts to slow its clocks.",
    "nvmlDeviceGetTemperatureThreshold(SLOWDOWN)", "celsius")
SHUTDOWN_TEMPERATURE_CELSIUS = _g(
    "fleetscope_gpu_shutdown_temperature_celsius", "Temperature at which the GPU shuts down.",
    "nvmlDeviceGetTemperatureThreshold(SHUTDOWN)", "celsius")
POWER_WATTS = _g(
    "fleetscope_gpu_power_watts",
    "Power draw (1 s average on Ampere-non-GA100 and newer, instantaneous on A100).",
    "nvmlDeviceGetPowerUsage", "watts", 1e-3)
POWER_LIMIT_WATTS = _g(
    "fleetscope_gpu_power_limit_watts", "Power limit the driver enforces.",
    "nvmlDeviceGetEnforcedPowerLimit", "watts", 1e-3)
ENERGY_JOULES_TOTAL = _g(
    "fleetscope_gpu_energy_joules_total", "Energy consumed since the driver was last loaded.",
    "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "joules", 1e-3)
CLOCK_HERTZ = _g(
    "fleetscope_gpu_clock_hertz", "Current clock (clock = sm, memory, graphics).",
    "nvmlDeviceGetClockInfo", "hertz", 1e6, ("clock",))
CLOCK_MAX_HERTZ = _g(
    "fleetscope_gpu_clock_max_hertz", "Maximum clock (clock = sm, memory, graphics).",
    "nvmlDeviceGetMaxClockInfo", "hertz", 1e6, ("clock",),
    AtDefault(None, why="a constant of the GPU model"))
THROTTLE_ACTIVE = _g(
    "fleetscope_gpu_throttle_active", "1 if this clocks-event (throttle) reason is active now, else 0.",
    "nvmlDeviceGetCurrentClocksEventReasons", labels=("reason",),
    at_default=AtDefault(
        (*_GPU, "reason"), unless="fleetscope_gpu_throttle_seconds_total",
        why="a sampled state: the reasons NVML counts time for are read from their time counter"))
THROTTLE_SECONDS_TOTAL = _g(
    "fleetscope_gpu_throttle_seconds_total",
    "Cumulative time the clocks were held down for this reason "
    "(sw_power_cap, sync_boost, sw_thermal, hw_thermal, hw_power_brake).",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_*", "seconds", 1e-9, ("reason",))
ECC_ERRORS_TOTAL = _g(
    "fleetscope_gpu_ecc_errors_total",
    "ECC errors; counter_type volatile resets at driver load, aggregate lives with the device.",
    "NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL", labels=("error_type", "counter_type"))
RETIRED_PAGES = _g(
    "fleetscope_gpu_retired_pages", "Pages retired (cause = single_bit, double_bit).",
    "NVML_FI_DEV_RETIRED_{SBE,DBE}", labels=("cause",))
RETIRED_PAGES_PENDING = _g(
    "fleetscope_gpu_retired_pages_pending", "1 if pages are waiting to be retired at the next driver load.",
    "NVML_FI_DEV_RETIRED_PENDING")
REMAPPED_ROWS = _g(
    "fleetscope_gpu_remapped_rows", "Rows remapped (cause = correctable, uncorrectable).",
    "NVML_FI_DEV_REMAPPED_{COR,UNC}", labels=("cause",))
ROW_REMAP_PENDING = _g(
    "fleetscope_gpu_row_remap_pending", "1 if a row remap waits for a GPU reset.", "NVML_FI_DEV_REMAPPED_PENDING")
ROW_REMAP_FAILED = _g(
    "fleetscope_gpu_row_remap_failed", "1 if a row remap has ever failed on this GPU.",
    "NVML_FI_DEV_REMAPPED_FAILURE")
PCIE_REPLAYS_TOTAL = _g(
    "fleetscope_gpu_pcie_replays_total", "PCIe replays (link-level retries).", "NVML_FI_DEV_PCIE_REPLAY_COUNTER")
PCIE_LINK_GENERATION = _g(
    "fleetscope_gpu_pcie_link_generation", "Current PCIe link generation.", "nvmlDeviceGetCurrPcieLinkGeneration")
PCIE_LINK_MAX_GENERATION = _g(
    "fleetscope_gpu_pcie_link_max_generation", "Maximum PCIe link generation.",
    "nvmlDeviceGetMaxPcieLinkGeneration")
PCIE_LINK_WIDTH = _g(
    "fleetscope_gpu_pcie_link_width", "Current PCIe link width (lanes).", "nvmlDeviceGetCurrPcieLinkWidth")
PCIE_LINK_MAX_WIDTH = _g(
    "fleetscope_gpu_pcie_link_max_width", "Maximum PCIe link width (lanes).", "nvmlDeviceGetMaxPcieLinkWidth")
PCIE_THROUGHPUT_BYTES_PER_SECOND = _g(
    "fleetscope_gpu_pcie_throughput_bytes_per_second",
    "PCIe throughput between the GPU's last two collections (GPM, Hopper and newer; direction = tx, rx). "
    "GPUs without GPM export fleetscope_gpu_pcie_bytes_total instead, or NVML's 20 ms sample with "
    "--gpu.pcie-sampler.",
    "NVML_GPM_METRIC_PCIE_{TX,RX}_PER_SEC (MiB/s), nvmlDeviceGetPcieThroughput (KB/s)", "bytes", 1024.0,
    ("direction",))
PCIE_BYTES_TOTAL = _g(
    "fleetscope_gpu_pcie_bytes_total",
    "Bytes the GPU sent (tx) and received (rx) over PCIe since the driver was loaded; on GPUs without GPM "
    "PCIe rates.",
    "NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES", "bytes", labels=("direction",))
PCIE_ERRORS_TOTAL = _g(
    "fleetscope_gpu_pcie_errors_total",
    "PCIe errors the GPU's link reported, by severity (correctable, non_fatal, fatal).",
    "NVML_FI_DEV_PCIE_COUNT_{CORRECTABLE_ERRORS,NON_FATAL_ERROR,FATAL_ERROR}", labels=("severity",))
PCIE_LINK_EVENTS_TOTAL = _g(
    "fleetscope_gpu_pcie_link_events_total",
    "PCIe data-link events behind the errors (event = bad_tlp, bad_dllp, nak_received, nak_sent, "
    "replay_rollover).",
    "NVML_FI_DEV_PCIE_COUNT_{BAD_TLP,BAD_DLLP,NAKS_RECEIVED,NAKS_SENT}, NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER",
    labels=("event",), at_default=AtDefault(None, why="the link's detail; fleetscope_gpu_pcie_errors_total says "
                                                      "whether it is healthy"))
# A GPU with a bad link is reset or replaced as a whole, so at the default level its 18 links (H100) are one.
NVLINK_UP = _g(
    "fleetscope_gpu_nvlink_up", "1 if the NVLink link is active, 0 if it is down.",
    "NVML_FI_DEV_NVLINK_GET_STATE", labels=("link",),
    at_default=AtDefault(_GPU, "min", why="0 when any of the GPU's links is down"))
NVLINK_ERRORS_TOTAL = _g(
    "fleetscope_gpu_nvlink_errors_total", "NVLink data-link errors per link (error = replay, recovery, crc).",
    "NVML_FI_DEV_NVLINK_ERROR_DL_{REPLAY,RECOVERY,CRC} per link; at the default level the all-link "
    "NVML_FI_DEV_NVLINK_{REPLAY,RECOVERY,CRC_FLIT,CRC_DATA}_ERROR_COUNT_TOTAL", labels=("link", "error"),
    at_default=AtDefault((*_GPU, "error"), why="a GPU with a bad link is reset or replaced as a whole"))
PERFORMANCE_STATE = _g(
    "fleetscope_gpu_performance_state", "Performance state (0 = P0, fastest ... 15).",
    "nvmlDeviceGetPerformanceState")
FAN_SPEED_RATIO = _g(
    "fleetscope_gpu_fan_speed_ratio", "Fan speed as a share of its maximum (absent on passively cooled boards).",
    "nvmlDeviceGetFanSpeed", "ratio", 0.01)
RECOVERY_ACTION = _g(
    "fleetscope_gpu_recovery_action",
    "The driver's required recovery action: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset.",
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
PROCESSES = _g(
    "fleetscope_gpu_processes", "Compute processes running on the GPU.", "nvmlDeviceGetComputeRunningProcesses")
PROCESS_MEMORY_BYTES = _g(
    "fleetscope_gpu_process_memory_bytes", "Device memory used by compute processes.",
    "nvmlDeviceGetComputeRunningProcesses.usedGpuMemory", "bytes")
SM_ACTIVE_RATIO = _g(
    "fleetscope_gpu_sm_active_ratio", "Share of SMs busy between two GPM samples (Hopper+).",
    "NVML_GPM_METRIC_SM_UTIL", "ratio", 0.01)
SM_OCCUPANCY_RATIO = _g(
    "fleetscope_gpu_sm_occupancy_ratio", "Resident warps relative to the theoretical maximum (GPM, Hopper+).",
    "NVML_GPM_METRIC_SM_OCCUPANCY", "ratio", 0.01)
TENSOR_ACTIVE_RATIO = _g(
    "fleetscope_gpu_tensor_active_ratio", "Share of time the SMs ran any tensor-core work (GPM, Hopper+).",
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL", "ratio", 0.01)
DRAM_ACTIVE_RATIO = _g(
    "fleetscope_gpu_dram_active_ratio", "DRAM bandwidth used relative to the theoretical maximum (GPM, Hopper+).",
    "NVML_GPM_METRIC_DRAM_BW_UTIL", "ratio", 0.01)
# The NVLink fabric: on NVSwitch systems (HGX H100/H200/B200 boards: p5, p5e, p6) a GPU is usable only once Fabric
# Manager registered it with the fabric; until then CUDA fails to initialise (error 802) while every gauge above
# looks healthy.
FABRIC_STATE = _g(
    "fleetscope_gpu_fabric_state",
    "The GPU's registration with the NVLink fabric (Fabric Manager): 0 not supported (no NVSwitch fabric, not a "
    "fault), 1 not started, 2 in progress, 3 completed; absent where the driver or GPU cannot tell (PCIe boards, "
    "pre-Hopper GPUs, drivers without the call).",
    "nvmlDeviceGetGpuFabricInfoV.state (NVML_GPU_FABRIC_STATE_*)")
FABRIC_STATUS = _g(
    "fleetscope_gpu_fabric_status",
    "The outcome of a completed fabric registration: 0 success, else the NVML error code (nvmlReturn_t) it failed "
    "with; only once fleetscope_gpu_fabric_state is 3.",
    "nvmlDeviceGetGpuFabricInfoV.status")
FABRIC_INFO = MetricSpec(
    "fleetscope_gpu_fabric_info", "info",
    "The GPU's place in the NVLink fabric once registered: its clique (the GPUs it reaches over NVLink) and "
    "cluster.", _GPU, raw="nvmlDeviceGetGpuFabricInfoV.cliqueId/clusterUuid", info_keys=("clique_id", "cluster_uuid"))
NVLINK_BYTES_TOTAL = _g(
    "fleetscope_gpu_nvlink_bytes_total",
    "Data bytes the GPU sent (tx) and received (rx) over NVLink, per link (protocol overhead not counted). On "
    "GPUs with GPM (Hopper+) GPM's rates summed over each collection interval since the daemon started; "
    "elsewhere the driver's counters since it was loaded, read every slow interval.",
    "NVML_GPM_METRIC_NVLINK_{TOTAL,L<n>}_{RX,TX}_PER_SEC (MiB/s); NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX} "
    "(KiB, scope UINT_MAX for all links)", "bytes", 1024.0, ("link", "direction"),
    AtDefault((*_GPU, "direction"), why="the fabric's traffic per GPU; a link's share matters only to find a slow "
                                        "link"))
# MIG: one GPU split into GPU instances (memory and SMs of their own), each holding compute instances.
MIG_INFO = MetricSpec(
    "fleetscope_gpu_mig_info", "info",
    "A MIG device of the GPU (MIG enabled): its GPU instance and compute instance ids, its UUID (MIG-..., what "
    "CUDA_VISIBLE_DEVICES and the kubelet name it by) and its name (the profile, e.g. 1g.18gb).",
    (*_GPU, "gpu_instance", "compute_instance"),
    raw="nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetGpuInstanceId/ComputeInstanceId/UUID/Name",
    info_keys=("mig_uuid", "name"))
MIG_MEMORY_USED_BYTES = _g(
    "fleetscope_gpu_mig_memory_used_bytes", "Device memory allocated in this MIG GPU instance.",
    "nvmlDeviceGetMemoryInfo(MIG device).used", "bytes", labels=("gpu_instance",))
MIG_MEMORY_TOTAL_BYTES = _g(
    "fleetscope_gpu_mig_memory_total_bytes", "Device memory of this MIG GPU instance.",
    "nvmlDeviceGetMemoryInfo(MIG device).total", "bytes", labels=("gpu_instance",))
MIG_SM_ACTIVE_RATIO = _g(
    "fleetscope_gpu_mig_sm_active_ratio",
    "Share of the instance's SMs busy between two GPM samples of it (Hopper+): its activity, where MIG leaves "
    "fleetscope_gpu_utilization_ratio unsupported.",
    "nvmlGpmMigSampleGet, NVML_GPM_METRIC_SM_UTIL", "ratio", 0.01, ("gpu_instance",))
MIG_SM_OCCUPANCY_RATIO = _g(
    "fleetscope_gpu_mig_sm_occupancy_ratio", "Resident warps of the instance relative to its maximum (GPM).",
    "nvmlGpmMigSampleGet, NVML_GPM_METRIC_SM_OCCUPANCY", "ratio", 0.01, ("gpu_instance",))
MIG_TENSOR_ACTIVE_RATIO = _g(
    "fleetscope_gpu_mig_tensor_active_ratio", "Share of time the instance's SMs ran tensor-core work (GPM).",
    "nvmlGpmMigSampleGet, NVML_GPM_METRIC_ANY_TENSOR_UTIL", "ratio", 0.01, ("gpu_instance",))
MIG_DRAM_ACTIVE_RATIO = _g(
    "fleetscope_gpu_mig_dram_active_ratio", "DRAM bandwidth the instance used relative to its maximum (GPM).",
    "nvmlGpmMigSampleGet, NVML_GPM_METRIC_DRAM_BW_UTIL", "ratio", 0.01, ("gpu_instance",))
LOST = _g(
    "fleetscope_gpu_lost", "1 if NVML reports the GPU lost (GPU_IS_LOST: fallen off the bus), else 0.",
    "NVML_ERROR_GPU_IS_LOST")
NVML_DEVICES = MetricSpec(
    "fleetscope_gpu_nvml_devices", "gauge", "GPUs NVML enumerates on this node.", raw="nvmlDeviceGetCount")

NVML_TABLE = table(
    "nvml",
    "Per-GPU telemetry and health from NVML (nvidia-ml-py), labelled gpu (NVML index) and uuid, in base units.",
    [
        ("info", INFO),
        ("driver_info", DRIVER_INFO),
        ("utilization", UTILIZATION_RATIO),
        ("memory_utilization", MEMORY_UTILIZATION_RATIO),
        ("memory_used", MEMORY_USED_BYTES),
        ("memory_free", MEMORY_FREE_BYTES),
        ("memory_total", MEMORY_TOTAL_BYTES),
        ("memory_reserved", MEMORY_RESERVED_BYTES),
        ("temperature", TEMPERATURE_CELSIUS),
        ("memory_temperature", MEMORY_TEMPERATURE_CELSIUS),
        ("slowdown_temperature", SLOWDOWN_TEMPERATURE_CELSIUS),
        ("shutdown_temperature", SHUTDOWN_TEMPERATURE_CELSIUS),
        ("power", POWER_WATTS),
        ("power_limit", POWER_LIMIT_WATTS),
        ("energy", ENERGY_JOULES_TOTAL),
        ("clock", CLOCK_HERTZ),
        ("clock_max", CLOCK_MAX_HERTZ),
        ("throttle_active", THROTTLE_ACTIVE),
        ("throttle_seconds", THROTTLE_SECONDS_TOTAL),
        ("ecc_errors", ECC_ERRORS_TOTAL),
        ("retired_pages", RETIRED_PAGES),
        ("retired_pages_pending", RETIRED_PAGES_PENDING),
        ("remapped_rows", REMAPPED_ROWS),
        ("row_remap_pending", ROW_REMAP_PENDING),
        ("row_remap_failed", ROW_REMAP_FAILED),
        ("pcie_replays", PCIE_REPLAYS_TOTAL),
        ("pcie_generation", PCIE_LINK_GENERATION),
        ("pcie_max_generation", PCIE_LINK_MAX_GENERATION),
        ("pcie_width", PCIE_LINK_WIDTH),
        ("pcie_max_width", PCIE_LINK_MAX_WIDTH),
        ("pcie_throughput", PCIE_THROUGHPUT_BYTES_PER_SECOND),
        ("pcie_bytes", PCIE_BYTES_TOTAL),
        ("pcie_errors", PCIE_ERRORS_TOTAL),
        ("pcie_link_events", PCIE_LINK_EVENTS_TOTAL),
        ("nvlink_up", NVLINK_UP),
        ("nvlink_errors", NVLINK_ERRORS_TOTAL),
        ("performance_state", PERFORMANCE_STATE),
        ("fan_speed", FAN_SPEED_RATIO),
        ("recovery_action", RECOVERY_ACTION),
        ("processes", PROCESSES),
        ("process_memory", PROCESS_MEMORY_BYTES),
        ("sm_active", SM_ACTIVE_RATIO),
        ("sm_occupancy", SM_OCCUPANCY_RATIO),
        ("tensor_active", TENSOR_ACTIVE_RATIO),
        ("dram_active", DRAM_ACTIVE_RATIO),
        ("fabric_state", FABRIC_STATE),
        ("fabric_status", FABRIC_STATUS),
        ("fabric_info", FABRIC_INFO),
        ("nvlink_bytes", NVLINK_BYTES_TOTAL),
        ("mig_info", MIG_INFO),
        ("mig_memory_used", MIG_MEMORY_USED_BYTES),
        ("mig_memory_total", MIG_MEMORY_TOTAL_BYTES),
        ("mig_sm_active", MIG_SM_ACTIVE_RATIO),
        ("mig_sm_occupancy", MIG_SM_OCCUPANCY_RATIO),
        ("mig_tensor_active", MIG_TENSOR_ACTIVE_RATIO),
        ("mig_dram_active", MIG_DRAM_ACTIVE_RATIO),
        ("lost", LOST),
        ("nvml_devices", NVML_DEVICES),
    ],
    collector="gpu",
)

# -- PCI bus ----------------------------------------------------------------------------------------

PCI_DEVICES = MetricSpec(
    "fleetscope_gpu_pci_devices", "gauge",
    "NVIDIA GPUs (vendor 0x10de, VGA or 3D controller class) present on the PCI bus.",
    raw="/sys/bus/pci/devices/*/{vendor,class}")
EXPECTED_DEVICES = MetricSpec(
    "fleetscope_gpu_expected_devices", "gauge",
    "GPUs this node should have (--gpu.expected-count); absent when not configured.")

PCI_TABLE = table(
    "pci",
    "NVIDIA GPUs counted on the PCI bus (sysfs), beside the number NVML sees and the configured expectation.",
    [("pci_devices", PCI_DEVICES), ("expected_devices", EXPECTED_DEVICES)],
    collector="gpu",
)

# -- Xid errors -------------------------------------------------------------------------------------

XID_ERRORS_TOTAL = MetricSpec(
    "fleetscope_gpu_xid_errors_total", "counter",
    "Xid errors per GPU and code since the daemon started, including those still in the kernel ring buffer "
    "at start. action is the NVIDIA Xid catalog's immediate-action class (RESET_GPU, RESTART_BM, "
    "RESTART_APP, IGNORE, ...; UNKNOWN if not in the catalog, all such codes counted as xid=\"unknown\"). "
    "A kernel-log Xid for an address that is none of the node's GPUs counts under gpu=\"other\". Without NVML "
    "the gpu label follows PCI bus order and uuid comes from the driver's log, if it printed one.",
    (*_GPU, "xid", "action"), raw="nvmlEventSetWait_v2 / NVRM: Xid")
LAST_XID_TIMESTAMP_SECONDS = MetricSpec(
    "fleetscope_gpu_last_xid_timestamp_seconds", "gauge",
    "Unix time of the GPU's most recent Xid error.", _GPU, unit="seconds")

XID_TABLE = table(
    "xid",
    "Xid errors counted from NVML events and the kernel log (one occurrence seen by both counts once).",
    [("xid_total", XID_ERRORS_TOTAL), ("last_xid", LAST_XID_TIMESTAMP_SECONDS)],
    collector="gpu",
)

# -- job attribution --------------------------------------------------------------------------------

JOB_INFO = MetricSpec(
    "fleetscope_gpu_job_info", "info",
    "A job using this GPU: training_job joins with fleetscope_training_* series; rank and local_rank from "
    "the process environment; slurm_job_id, pod_uid and container from its cgroup, environment or prolog record.",
    _GPU, raw="/proc/<pid>/{cgroup,environ}, --gpu.jobs-dir",
    info_keys=("training_job", "rank", "local_rank", "slurm_job_id", "pod_uid", "container"))

MIG_JOB_INFO = MetricSpec(
    "fleetscope_gpu_mig_job_info", "info",
    "A job using this MIG GPU instance (its processes' instance, as NVML reports it), as fleetscope_gpu_job_info "
    "for a whole GPU.",
    (*_GPU, "gpu_instance"), raw="nvmlDeviceGetComputeRunningProcesses.gpuInstanceId, /proc/<pid>/{cgroup,environ}",
    info_keys=JOB_INFO.info_keys)

ALLOCATION_INFO = MetricSpec(
    "fleetscope_gpu_allocation_info", "info",
    "A pod container the kubelet allocated this GPU to, idle or not (--gpu.pod-resources-socket): resource is "
    "the device plugin resource (nvidia.com/gpu, nvidia.com/mig-*), device its id (the GPU's or the MIG "
    "device's UUID). Read at the slow interval; absent when the setting is off.",
    _GPU, raw="kubelet pod-resources v1.PodResourcesLister/List",
    info_keys=("pod", "namespace", "container", "resource", "device"))

JOBS_TABLE = table(
    "gpu_jobs",
    "GPU-to-job attribution from the GPU's processes (procfs cgroup and environment), Slurm prolog records "
    "and the kubelet's pod-resources API.",
    [("job_info", JOB_INFO), ("mig_job_info", MIG_JOB_INFO), ("allocation_info", ALLOCATION_INFO)],
    collector="gpu",
)

TABLES = (NVML_TABLE, PCI_TABLE, XID_TABLE, JOBS_TABLE)
