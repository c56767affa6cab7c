from __future__ import annotations

import os
from collections import Counter

import pytest

from fleetscope.errors import SourceError
from fleetscope.sources.fs import Root
from fleetscope.sources.kmsg import KmsgReader, boot_time, parse_xid_text
from fleetscope.sources.xid import PciAddress
from tests.conftest import FIXTURES

VARIANTS = os.path.join(FIXTURES, "kmsg", "variants.kmsg")
BOOT = 1_700_000_000.0


def pci(text: str) -> PciAddress:
    return PciAddress.parse(text)


def read_all(path: str) -> list:
    reader = KmsgReader(path, BOOT)
    try:
        return list(reader.poll().xids)
    finally:
        reader.close()


def test_every_variant_yields_the_right_gpu_and_xid() -> None:
    xids = read_all(VARIANTS)
    counts = Counter((str(x.pci), x.xid) for x in xids)
    assert counts == {
        ("0000:53:00", 13): 2, ("0000:53:00", 79): 1, ("0000:64:00", 31): 1, ("0000:75:00", 31): 1,
        ("0000:86:00", 32): 1, ("0000:97:00", 13): 1, ("0000:a8:00", 149): 1, ("0000:b9:00", 154): 1,
        ("0000:ca:00", 79): 2,  # the Xid line and the multi-line message: the ledger makes them one
    }


def test_multiline_fallen_off_the_bus_marks_the_gpu_it_names() -> None:
    fallen = [x for x in read_all(VARIANTS) if x.multiline]
    assert [(str(x.pci), x.xid) for x in fallen] == [("0000:ca:00", 79), ("0000:53:00", 79)]
    # Stamped at the record that named the GPU, converted from usec since boot.
    assert fallen[0].timestamp == pytest.approx(BOOT + 3.8)


def test_pid_and_name_fields_are_optional() -> None:
    by_pci = {str(x.pci): x for x in read_all(VARIANTS) if not x.multiline}
    assert (by_pci["0000:53:00"].pid, by_pci["0000:53:00"].process) == (4101, "python3")
    assert (by_pci["0000:64:00"].pid, by_pci["0000:64:00"].process) == (None, "")
    assert (by_pci["0000:75:00"].pid, by_pci["0000:75:00"].process) == (11461, "")
    assert by_pci["0000:75:00"].message.startswith("Ch 00000053")
    assert by_pci["0000:86:00"].pid is None and by_pci["0000:86:00"].message == "Channel ID 00000005 intr 00008000"


def test_nvlink5_subcode_and_recovery_action_text() -> None:
    by_xid = {x.xid: x for x in read_all(VARIANTS)}
    assert (by_xid[149].nvlink_severity, by_xid[149].nvlink_link) == ("Fatal", -1)
    assert by_xid[154].recovery_action == 1


def test_gpu_announcement_maps_pci_to_uuid() -> None:
    reader = KmsgReader(VARIANTS, BOOT)
    batch = reader.poll()
    reader.close()
    assert batch.uuids == {pci("0000:53:00"): "GPU-11111111-2222-3333-4444-555555555555"}


@pytest.mark.parametrize("line, expected", [
    ("NVRM: Xid (PCI:0000:cb:00): 48, pid=1, name=x, DBE (0x1) detected", ("0000:cb:00", 48)),
    ("[  123.456] NVRM: Xid (PCI:0001:0a:00): 119, pid=2, name=y, Timeout after 6s", ("0001:0a:00", 119)),
    ("kernel: NVRM: Xid (PCI:0000:53:00.0): 94, Contained: SM", ("0000:53:00", 94)),
    ("NVRM: Xid (0000:01:00): 13, 0000 00000000", ("0000:01:00", 13)),
])
def test_line_prefixes_and_pci_forms(line: str, expected: tuple[str, int]) -> None:
    xid = parse_xid_text(line, 0.0)
    assert xid is not None and (str(xid.pci), xid.xid) == expected


def test_lines_that_are_not_xids() -> None:
    assert parse_xid_text("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48", 0.0) is None
    assert parse_xid_text("NVRM: GPU at PCI:0000:53:00: GPU-1", 0.0) is None


def test_follows_new_records_without_counting_old_ones_twice(tmp_path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("4,1,1000000,-;NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus.\n")
    reader = KmsgReader(str(log), BOOT)
    assert [x.xid for x in reader.poll().xids] == [79]
    assert reader.poll().xids == ()
    with open(log, "a") as handle:
        handle.write("4,2,2000000,-;NVRM: Xid (PCI:0000:64:00): 48, pid=1, name=p, DBE")  # no newline yet
    assert reader.poll().xids == ()  # an incomplete record waits for its end
    with open(log, "a") as handle:
        handle.write(" (0x1)\n")
    [xid] = reader.poll().xids
    assert (str(xid.pci), xid.xid, xid.message) == ("0000:64:00", 48, "DBE (0x1)")
    reader.close()


def test_missing_log_is_a_source_error(tmp_path) -> None:
    reader = KmsgReader(str(tmp_path / "absent"), BOOT)
    with pytest.raises(SourceError):
        reader.poll()


def test_malformed_records_are_skipped(tmp_path) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"garbage without header\n\xff\xfe;;;\n4,9,x,-;NVRM: Xid (PCI:zz:zz:zz): 1, bad\n"
                    b"4,10,1000,-;NVRM: Xid (PCI:0000:53:00): 63, ok\n")
    assert [(str(x.pci), x.xid) for x in read_all(str(log))] == [("0000:53:00", 63)]


def test_boot_time_from_proc_stat(tmp_path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1699999000\nprocesses 5\n")
    assert boot_time(Root(str(tmp_path))) == 1699999000.0
    assert boot_time(Root(str(tmp_path / "absent"))) > 0  # falls back to now - monotonic


# -- whose words count (#35 item 6): the driver's own records only -----------------------------------------

FORGED = "x NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=python, GPU has fallen off the bus"
# The kernel's segfault report names the crashing task (its name cut to 15 characters) and the file it ran.
SEGFAULT = (f"6,500,1000000,-;x NVRM: Xid (PC[4321]: segfault at 0 ip 0000000000401000 sp 00007ffd0000 error 4 "
            f"in {FORGED}[401000+1000] likely on CPU 3 (core 3, socket 0)\n")
GENUINE = "4,501,2000000,-;NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"


def test_a_users_segfault_report_is_no_xid_while_the_drivers_line_is(tmp_path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(SEGFAULT + GENUINE)
    assert [(str(x.pci), x.xid, x.timestamp) for x in read_all(str(log))] == [("0000:53:00", 79, BOOT + 2.0)]
    assert parse_xid_text(SEGFAULT.split(";", 1)[1], 0.0) is None
    assert parse_xid_text(f"[  12.5] {FORGED}", 0.0) is None


def test_a_record_a_process_wrote_to_kmsg_is_not_the_kernels(tmp_path) -> None:
    log = tmp_path / "kmsg"  # facility 1 (user): what writing to /dev/kmsg gives, whatever the text
    log.write_text("12,1,1000000,-;NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=p, GPU has fallen off the bus.\n"
                   "14,2,1000001,-;NVRM: The NVIDIA GPU 0000:53:00.0\\x0aNVRM: fallen off the bus and is not "
                   "responding to commands.\n")
    assert read_all(str(log)) == []


def test_fallen_off_the_bus_text_from_another_record_completes_no_message(tmp_path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("3,1,1000000,-;NVRM: The NVIDIA GPU 0000:53:00.0\n"
                   "6,2,1000001,-;evil[77]: segfault at 0 in fallen off the bus and is not responding to commands\n")
    assert read_all(str(log)) == []


def test_a_full_ring_buffer_is_read_within_the_poll_budget_and_then_resumed(tmp_path) -> None:
    """100k records of someone else's: one poll stops at its budget, the next ones go on from there."""
    log = tmp_path / "kmsg"
    filler = "".join(f"6,{n},{n},-;audit: type=1400 apparmor=DENIED operation=open name=/x{n}\n"
                     for n in range(100_000))
    log.write_text(filler + GENUINE)
    ticks = iter(range(10**9))
    reader = KmsgReader(str(log), BOOT, budget=20, clock=lambda: float(next(ticks)))  # one tick per read
    polls = [reader.poll()]
    assert reader.behind and polls[0].xids == ()
    while reader.behind:
        polls.append(reader.poll())
    reader.close()
    assert [x.xid for batch in polls for x in batch.xids] == [79]
    assert len(polls) > 2  # the file needed several budgets' worth of reads
