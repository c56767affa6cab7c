"""Issue 38 in the NVML source, against the real pynvml code over the fake: the GPU's NVLink fabric registration,
NVLink traffic (GPM's rates summed into byte counters, else the driver's counters) and MIG instances."""

from __future__ import annotations

from fleetscope.sources.nvml import FabricInfo
from fleetscope.sources.nvml_h import FI_DEV_NVLINK_THROUGHPUT_DATA_RX, FI_DEV_NVLINK_THROUGHPUT_DATA_TX
from fleetscope_sim.nvml_fake import NvmlReturn
from tests.sources.conftest import collect

MIB = 1024  # KiB per MiB: the reading keeps NVLink bytes in the driver's unit, KiB


# -- fabric -------------------------------------------------------------------------------------------------------


def test_a_registered_gpu_reports_its_state_status_clique_and_cluster(node) -> None:
    fake, source, clock = node()
    gpu = collect(source, clock, 1).samples[3]
    assert gpu.scalars["fabric_state"] == 3 and gpu.scalars["fabric_status"] == 0
    assert gpu.fabric == FabricInfo(3, 0, 32766, "5f1c2a9e-7b3d-4c8e-9a61-0d2e4f6a8b10")
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == 8 and "nvmlDeviceGetGpuFabricInfo" not in fake.calls


def test_fabric_manager_down_in_progress_and_failed(node) -> None:
    _, source, clock = node("fabric_manager_down")
    samples = collect(source, clock, 1).samples
    assert samples[0].scalars["fabric_state"] == 1 and "fabric_status" not in samples[0].scalars  # not started
    assert samples[6].scalars["fabric_state"] == 2 and samples[6].fabric == FabricInfo(2)  # in progress
    assert samples[7].scalars["fabric_state"] == 3
    assert samples[7].scalars["fabric_status"] == NvmlReturn.named("NVML_ERROR_INSUFFICIENT_RESOURCES").code


def test_state_not_supported_is_state_0_and_no_answer_is_no_value(node) -> None:
    fake, source, clock = node()
    fake.gpu(0).set(fabric={"state": 0, "clique_id": 0, "cluster_uuid": ""})  # an H200 alone in a VM answered so
    fake.gpu(1).set(fabric=None)  # a PCIe board or an older GPU: the call answers NOT_SUPPORTED
    samples = collect(source, clock, 1).samples
    assert samples[0].scalars["fabric_state"] == 0 and samples[0].fabric == FabricInfo(0)
    assert "fabric_state" not in samples[1].scalars and samples[1].fabric is None


def test_fabric_is_a_slow_value_read_again_every_slow_interval(node) -> None:
    fake, source, clock = node(slow_interval=60.0)
    collect(source, clock, 1)
    collect(source, clock, 6)  # 60 s: each GPU's slow read once more
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == 16
    fake.gpu(2).set(fabric={"state": 1})  # Fabric Manager restarted and lost it
    assert collect(source, clock, 6).samples[2].scalars["fabric_state"] == 1


def test_a_driver_without_the_versioned_call_answers_through_the_deprecated_one(node) -> None:
    fake, source, clock = node()
    fake.missing_functions.add("nvmlDeviceGetGpuFabricInfoV")
    gpu = collect(source, clock, 1).samples[4]
    assert gpu.fabric == FabricInfo(3, 0, 32766, "5f1c2a9e-7b3d-4c8e-9a61-0d2e4f6a8b10")
    assert fake.calls["nvmlDeviceGetGpuFabricInfo"] == 8


# -- NVLink traffic -----------------------------------------------------------------------------------------------


def test_gpm_nvlink_rates_are_summed_into_byte_counters(node) -> None:
    fake, source, clock = node()
    fake.gpu(2).set(nvlink_mibps={"tx": [100.0] * 18, "rx": [50.0] * 18})
    collect(source, clock, 1)  # the first GPM sample
    reading = collect(source, clock, 3)  # three 10 s intervals at 1,800 MiB/s sent, 900 received
    assert reading.samples[2].labelled["nvlink_bytes"] == {("", "tx"): 1800 * MIB * 30, ("", "rx"): 900 * MIB * 30}
    assert reading.samples[3].labelled["nvlink_bytes"] == {("", "tx"): 0, ("", "rx"): 0}
    assert fake.calls["nvmlGpmMetricsGet"] == 3 * 8  # in the one GPM request per GPU and collection
    assert fake.fields_asked[FI_DEV_NVLINK_THROUGHPUT_DATA_TX] == 0  # GPM answers: no counters needed


def test_per_link_at_detail_all(node) -> None:
    fake, source, clock = node(per_link=True)
    fake.gpu(0).set(nvlink_mibps={"tx": [float(link) for link in range(18)], "rx": [0.0] * 18})
    reading = collect(source, clock, 2)
    links = reading.samples[0].labelled["nvlink_bytes"]
    assert links[("17", "tx")] == 17 * MIB * 10 and links[("0", "tx")] == 0 and len(links) == 36


def test_without_gpm_the_driver_counters_all_links_at_once_per_link_at_detail_all(node) -> None:
    fake, source, clock = node("a100_8x")
    fake.gpu(1).set(nvlink_kib={"tx": [1000] * 12, "rx": [500] * 12})
    reading = collect(source, clock, 1)
    assert reading.samples[1].labelled["nvlink_bytes"] == {("", "tx"): 12000, ("", "rx"): 6000}
    assert fake.fields_asked[FI_DEV_NVLINK_THROUGHPUT_DATA_TX] == 8  # once per GPU (scope UINT_MAX), not per link
    fake, source, clock = node("a100_8x", per_link=True)
    fake.gpu(1).set(nvlink_kib={"tx": [1000] * 12, "rx": [500] * 12})
    links = collect(source, clock, 1).samples[1].labelled["nvlink_bytes"]
    assert links[("11", "rx")] == 500 and len(links) == 24
    assert fake.fields_asked[FI_DEV_NVLINK_THROUGHPUT_DATA_RX] == 8 * 12  # per link


def test_gpm_without_nvlink_rates_falls_back_to_the_counters(node) -> None:
    fake, source, clock = node()
    fake.gpu(5).set(nvlink_mibps={"tx": [None] * 18, "rx": [None] * 18}, nvlink_kib={"tx": [7] * 18, "rx": [3] * 18})
    collect(source, clock, 2)  # GPM said NOT_SUPPORTED for NVLink at the second collection
    reading = collect(source, clock, 6)  # the GPU's next slow read asks the driver's counters
    assert reading.samples[5].labelled["nvlink_bytes"] == {("", "tx"): 7 * 18, ("", "rx"): 3 * 18}


def test_a_gpu_without_nvlink_exports_no_nvlink_traffic(node) -> None:
    fake, source, clock = node()
    fake.gpu(4).set(nvlink_up=[], nvlink_kib={"tx": [], "rx": []}, nvlink_mibps={"tx": [], "rx": []})
    source.close()
    reading = collect(source, clock, 3)
    assert "nvlink_bytes" not in reading.samples[4].labelled and reading.samples[4].nvlink_links == 0


# -- MIG ----------------------------------------------------------------------------------------------------------


def test_mig_devices_memory_and_gpm_per_gpu_instance(node) -> None:
    fake, source, clock = node("mig_enabled")
    reading = collect(source, clock, 2)  # per-instance GPM ratios need two samples of the instance
    gpu = reading.samples[0]
    assert [(d.gpu_instance, d.compute_instance, d.name.rsplit(" ", 1)[-1]) for d in gpu.mig] == [
        (1, 0, "3g.40gb"), (5, 0, "2g.20gb"), (13, 0, "1g.10gb")]
    assert all(d.uuid.startswith("MIG-") for d in gpu.mig) and len({d.uuid for d in gpu.mig}) == 3
    assert gpu.labelled["mig_memory_used"] == {("1",): 30000000000, ("5",): 9000000000, ("13",): 0}
    assert gpu.labelled["mig_memory_total"][("1",)] == 42298834944
    assert gpu.labelled["mig_sm_active"] == {("1",): 88.5, ("5",): 12.0, ("13",): 0.0}
    assert gpu.labelled["mig_tensor_active"][("1",)] == 71.25
    assert [(p.pid, p.gpu_instance) for p in gpu.processes] == [(4101, 1), (4201, 5)]
    assert "utilization" not in gpu.scalars  # NVML: not supported with MIG
    assert reading.samples[1].mig[0].uuid != gpu.mig[0].uuid  # each GPU's instances are its own
    whole = reading.samples[6]
    assert whole.mig == () and "mig_memory_used" not in whole.labelled
    assert [p.gpu_instance for p in whole.processes] == [None]
    assert fake.calls["nvmlDeviceGetMaxMigDeviceCount"] >= 4  # MIG GPUs only: at their slow reads


def test_mig_devices_are_enumerated_at_slow_reads_and_sampled_every_collection(node) -> None:
    fake, source, clock = node("mig_enabled", slow_interval=60.0)
    collect(source, clock, 1)
    enumerated = fake.calls["nvmlDeviceGetMigDeviceHandleByIndex"]
    assert enumerated == 4 * 7  # each of the 7 slots of the 4 MIG GPUs, empty ones answering NOT_FOUND
    collect(source, clock, 6)  # one slow interval: each MIG GPU enumerated once more
    assert fake.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 2 * enumerated
    assert fake.calls["nvmlGpmMigSampleGet"] == 7 * (3 + 2 * 3)  # every instance, every collection
    fake.gpu(2).mig_devices.pop()  # an administrator destroyed an instance: gone at the GPU's next slow read
    reading = collect(source, clock, 6)
    assert [d.gpu_instance for d in reading.samples[2].mig] == [1]
    assert set(reading.samples[2].labelled["mig_memory_used"]) == {("1",)}


def test_a_gpm_metric_answered_nan_is_left_out(node) -> None:
    fake, source, clock = node()
    fake.gpu(1).set(gpm={"sm_active": 0.0, "sm_occupancy": 0.0, "tensor_active": 0.0, "dram_active": float("nan")})
    gpu = collect(source, clock, 2).samples[1]
    assert "dram_active" not in gpu.scalars and gpu.scalars["sm_active"] == 0.0  # missing, not NaN
