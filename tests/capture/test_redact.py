"""Pseudonyms: the shape of the original, one per original, none shared between captures, and no leak."""

from __future__ import annotations

import re

from fleetscope.capture.redact import Redactor


def test_pseudonyms_keep_the_shape_and_the_identity() -> None:
    redactor = Redactor()
    mac = redactor.mac("0a:3f:5c:21:7e:01")
    assert re.fullmatch(r"02(:[0-9a-f]{2}){5}", mac) and redactor.mac("0A:3F:5C:21:7E:01") == mac
    assert redactor.mac("00:00:00:00:00:00") == "00:00:00:00:00:00"  # loopback's: identifies nothing
    uuid = redactor.gpu_uuid("GPU-11111111-2222-3333-4444-555555555555")
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", uuid)
    assert re.fullmatch(r"\d{13}", redactor.gpu_serial("1654922000000"))
    assert re.fullmatch(r"[0-9a-f]{4}(:[0-9a-f]{4}){3}", redactor.node_guid("0000:0010:1b00:0000"))
    assert redactor.ipv4("10.1.2.3").startswith("198.1")
    assert redactor.ipv6("fe80::1").startswith("2001:db8:")
    assert Redactor().mac("0a:3f:5c:21:7e:01") != mac  # a fresh key: another capture, other pseudonyms


def test_free_text_loses_addresses_names_and_identities() -> None:
    redactor = Redactor()
    redactor.protect("hostname", ["ip-10-1-2-3.ec2.internal", "ip-10-1-2-3", "gpu", "localhost"])
    redactor.protect("ipv4", ["10.1.2.3"])
    line = ("NVRM: GPU at PCI:0000:53:00: GPU-11111111-2222-3333-4444-555555555555 host ip-10-1-2-3.ec2.internal "
            "peer 172.31.9.9 fe80::1:2 mac 0a:3f:5c:21:7e:01 name=secret_job, name=python3 "
            "Kernel Module 550.90.07 vbios 96.00.99.00.01 at 09:35:42 Serial Number: 1654922000000 gpu 3")
    out = redactor.text(line)
    for original in ("GPU-11111111", "ip-10-1-2-3", "172.31.9.9", "fe80::1:2", "0a:3f:5c", "secret_job",
                     "1654922000000"):
        assert original not in out, original
    for kept in ("PCI:0000:53:00", "name=python3", "550.90.07", "96.00.99.00.01", "09:35:42", "gpu 3"):
        assert kept in out, kept
    assert redactor.leaks(out) == [] and "hostname" in redactor.leaks(line)
    assert set(redactor.counts()) >= {"gpu_uuid", "gpu_serial", "hostname", "ipv4", "ipv6", "mac", "process"}
    assert "gpu" not in redactor.mapping().get("hostname", {}).values()  # too common to search for
