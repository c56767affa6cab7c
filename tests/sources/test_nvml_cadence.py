"""What the NVML source asks, collection by collection (#25): calls and fields counted, never timed.

Constants once per GPU (and again after a reset or a driver reload), NOT_SUPPORTED answers asked again
only after ``unsupported_retry``, slow counters every ``slow_interval`` with the GPUs spread over it (and
at once after an error event), and no 20 ms PCIe sampling where GPM or the byte counters answer.
"""

from __future__ import annotations

import time
from collections import Counter

from fleetscope.sources.nvml_h import EVENT_DOUBLE_BIT_ECC
from tests.sources.conftest import collect

# Entry points whose answer only a reset changes: asked in a GPU's first collection, then never again.
CONSTANT_CALLS = (
    "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMigMode", "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth", "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc",
)
ECC_UNCORRECTED_VOLATILE = 4  # a slow field


def test_constants_are_read_once_per_gpu(node) -> None:
    fake, source, clock = node()
    source.read()
    first, first_fields = dict(fake.calls), Counter(fake.fields_asked)
    assert first["nvmlDeviceGetMaxClockInfo"] == 3 * 8 and first["nvmlDeviceGetTemperatureThreshold"] == 2 * 8
    reading = collect(source, clock, 30)  # 5 minutes at the default 10 s
    assert {name: fake.calls[name] - first[name] for name in CONSTANT_CALLS} == dict.fromkeys(CONSTANT_CALLS, 0)
    assert fake.fields_asked[91] == first_fields[91] == 8  # NVLink link count: once per GPU
    assert fake.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0
    # ... and still exported every collection
    gpu = reading.samples[2]
    assert gpu.labelled["clock_max"][("sm",)] == 1980 and gpu.scalars["slowdown_temperature"] == 89
    assert gpu.scalars["pcie_max_width"] == 16 and gpu.nvlink_links == 18


def test_not_supported_is_asked_again_only_after_the_retry_interval(node) -> None:
    fake, source, clock = node(unsupported_retry=600.0)
    source.read()
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 8 and fake.fields_asked[29] == 8  # fan, retired pages
    collect(source, clock, 59)  # 590 s
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 8 and fake.fields_asked[29] == 8
    collect(source, clock, 1)  # 600 s: a driver update may have brought them
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 16
    collect(source, clock, 6)  # a retired-pages field is slow: each GPU asks at its next slow read
    assert fake.fields_asked[29] == 16
    fake.gpu(1).set(fan_percent=40)  # and what answers is read again every collection
    reading = collect(source, clock, 60)
    assert reading.samples[1].scalars["fan_speed"] == 40 and "fan_speed" not in reading.samples[0].scalars


def test_slow_values_every_interval_with_the_gpus_spread_over_it(node) -> None:
    fake, source, clock = node(slow_interval=60.0)
    source.read()
    slow_reads, batches = [], []
    for _ in range(12):  # two intervals
        before, calls = Counter(fake.fields_asked), fake.calls["nvmlDeviceGetFieldValues"]
        reading = collect(source, clock, 1)
        slow_reads.append(fake.fields_asked[ECC_UNCORRECTED_VOLATILE] - before[ECC_UNCORRECTED_VOLATILE])
        batches.append(fake.calls["nvmlDeviceGetFieldValues"] - calls)
        assert all(s.scalars["memory_temperature"] == 61 for s in reading.samples)  # served between reads
    assert sum(slow_reads[:6]) == sum(slow_reads[6:]) == 8  # each GPU once per 60 s
    assert max(slow_reads) <= 2 and min(slow_reads) >= 1  # never all eight in one collection
    assert batches == slow_reads  # one field-value batch per slow read, none otherwise


def test_a_slow_value_stays_until_its_next_read_and_an_error_event_reads_it_at_once(node) -> None:
    fake, source, _ = node(on_xid=lambda sighting: None)
    source.read()
    deadline = time.monotonic() + 240  # a hang guard: each wait below ends once its condition holds
    while fake.calls.get("nvmlDeviceRegisterEvents", 0) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)  # the watcher registers each GPU from its own thread
    fake.gpu(5).ecc["uncorrected_volatile"] = 2  # type: ignore[index]
    ecc = ("uncorrected", "volatile")
    assert source.read().samples[5].labelled["ecc_errors"][ecc] == 0  # not due: the last read stands
    fake.inject_event(5, EVENT_DOUBLE_BIT_ECC)
    seen = 0.0
    while time.monotonic() < deadline:
        seen = source.read().samples[5].labelled["ecc_errors"][ecc]
        if seen:
            break
        time.sleep(0.01)
    assert seen == 2


def test_a_gpu_reset_has_its_constants_read_again(node) -> None:
    fake, source, clock = node(slow_interval=60.0)
    source.read()
    collect(source, clock, 3)
    before = dict(fake.calls)
    fake.reset_gpu(3, slowdown_temperature=87)  # a reset that brought new settings
    reading = collect(source, clock, 7)  # its next slow read sees energy and volatile ECC back at 0
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] - before["nvmlDeviceGetMaxClockInfo"] == 3  # GPU 3 alone
    assert fake.calls["nvmlDeviceGetTemperatureThreshold"] - before["nvmlDeviceGetTemperatureThreshold"] == 2
    assert reading.samples[3].scalars["slowdown_temperature"] == 87
    assert reading.samples[2].scalars["slowdown_temperature"] == 89


def test_a_driver_reload_opens_the_session_again_and_reads_every_constant(node) -> None:
    fake, source, clock = node()
    source.read()
    collect(source, clock, 2)
    before = dict(fake.calls)
    fake.reload_driver()
    reading = collect(source, clock, 1)
    assert len(reading.samples) == 8 and reading.lost == ()
    assert fake.calls["nvmlInitWithFlags"] - before["nvmlInitWithFlags"] == 1
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] - before["nvmlDeviceGetMaxClockInfo"] == 3 * 8
    assert reading.samples[0].scalars["energy"] == 0  # read at once: the session is new


def test_no_pcie_sampling_where_gpm_answers_even_when_the_sampler_is_on(node) -> None:
    fake, source, clock = node(pcie_sampler=True)
    source.read()
    reading = collect(source, clock, 3)
    assert fake.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0
    assert reading.samples[0].labelled["pcie_throughput"][("rx",)] == 2500000


def test_without_gpm_the_pcie_byte_counters_and_the_sampler_only_when_asked(node) -> None:
    fake, source, clock = node("a100_8x")
    reading = collect(source, clock, 3)
    assert fake.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0
    assert reading.samples[4].labelled["pcie_bytes"] == {("tx",): 912345678900, ("rx",): 1824691357800}
    assert "pcie_throughput" not in reading.samples[4].labelled
    fake, source, clock = node("a100_8x", pcie_sampler=True)
    reading = collect(source, clock, 3)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 3 * 8 * 2  # opt-in: 2 x 20 ms per GPU and collection
    assert "pcie_throughput" in reading.samples[4].labelled
