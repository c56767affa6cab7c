from __future__ import annotations

import pytest

from fleetscope.sources.xid import PciAddress, XidLedger, XidSighting, is_fatal, xid_action

GPU_A = PciAddress(0, 0x53, 0)
GPU_B = PciAddress(0, 0x64, 0)


@pytest.mark.parametrize("xid, action, fatal", [
    (79, "RESTART_BM", True), (48, "WORKFLOW_XID_48", True), (119, "RESET_GPU", True),
    (74, "WORKFLOW_NVLINK_ERR", True),
    (13, "RESTART_APP", False), (31, "RESTART_APP", False), (63, "IGNORE", False), (94, "RESTART_APP", False),
    (69, "RESTART_APP", False), (12345, "UNKNOWN", False),
])
def test_catalog_action_class(xid: int, action: str, fatal: bool) -> None:
    assert xid_action(xid) == action
    assert is_fatal(xid) is fatal


@pytest.mark.parametrize("text", ["00000000:53:00.0", "0000:53:00", "0000:53:00.0", "53:00"])
def test_pci_forms_normalise_to_one_key(text: str) -> None:
    assert PciAddress.parse(text) == GPU_A


def test_pci_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a PCI address"):
        PciAddress.parse("not-an-address")


def test_same_xid_from_both_sources_counts_once() -> None:
    ledger = XidLedger(window=10)
    assert ledger.record(XidSighting(GPU_A, 79, 1000.0, "nvml"))
    assert not ledger.record(XidSighting(GPU_A, 79, 1003.0, "kmsg"))
    assert not ledger.record(XidSighting(GPU_A, 79, 1003.5, "kmsg_fallen"))
    assert ledger.counts() == {(GPU_A, 79): 1}


def test_repeats_from_one_source_all_count() -> None:
    ledger = XidLedger(window=10)
    for stamp in (1000.0, 1000.5, 1001.0):
        assert ledger.record(XidSighting(GPU_A, 13, stamp, "nvml"))
    # The log's copies of those three join them one by one.
    for stamp in (1000.1, 1000.6, 1001.1):
        assert not ledger.record(XidSighting(GPU_A, 13, stamp, "kmsg"))
    assert ledger.record(XidSighting(GPU_A, 13, 1001.2, "kmsg"))  # a fourth, seen only in the log
    assert ledger.counts() == {(GPU_A, 13): 4}


def test_outside_window_or_other_gpu_or_other_xid_is_new() -> None:
    ledger = XidLedger(window=10)
    ledger.record(XidSighting(GPU_A, 79, 1000.0, "nvml"))
    assert ledger.record(XidSighting(GPU_A, 79, 1011.0, "kmsg"))
    assert ledger.record(XidSighting(GPU_B, 79, 1000.0, "kmsg"))
    assert ledger.record(XidSighting(GPU_A, 48, 1000.0, "kmsg"))
    assert ledger.counts() == {(GPU_A, 79): 2, (GPU_B, 79): 1, (GPU_A, 48): 1}
    assert ledger.last_timestamps() == {GPU_A: 1011.0, GPU_B: 1000.0}
    assert [s.timestamp for s in ledger.since(1005.0)] == [1011.0]


def test_codes_outside_the_catalog_share_one_key() -> None:
    from fleetscope.sources.xid import UNKNOWN_CODE, xid_label
    ledger = XidLedger()
    gpu = PciAddress.parse("0000:53:00")
    for code in (5000, 5001, 999):
        ledger.record(XidSighting(gpu, code, float(code), "kmsg"))
    ledger.record(XidSighting(gpu, 79, 1.0, "kmsg"))
    assert ledger.counts() == {(gpu, UNKNOWN_CODE): 3, (gpu, 79): 1}
    assert xid_label(UNKNOWN_CODE) == "unknown"
