"""Pseudonyms: the shape of the original, one per original, none shared between captures, and no leak."""

from __future__ import annotations

import re

import pytest

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


# -- every form an identifier is written in (#30 item 3) -----------------------------------------------

MAC = "0a:3f:5c:21:7e:01"
UUID = "11111111-2222-3333-4444-555555555555"
SERIAL = "1654922000000"


def protected() -> Redactor:
    redactor = Redactor()
    redactor.protect("hostname", ["trainer-node-7.cluster.example.com"])
    redactor.protect("ipv4", ["10.20.30.40"])
    redactor.protect("mac", [MAC])
    redactor.gpu_uuid("GPU-" + UUID)
    redactor.gpu_serial(SERIAL)
    return redactor


FORMS = {
    "short host name": "host trainer-node-7 up",
    "short host name, uppercase": "TRAINER-NODE-7: link up",
    "host name, uppercase": "TRAINER-NODE-7.CLUSTER.EXAMPLE.COM",
    "MAC, dashed": "mac 0A-3F-5C-21-7E-01",
    "MAC, bare": "mac 0a3f5c217e01",
    "MAC, bare uppercase": "mac 0A3F5C217E01",
    "MAC, dotted": "mac 0a3f.5c21.7e01",
    "address, dashed": "peer ip-10-20-30-40",
    "UUID, lowercase prefix": "gpu-" + UUID,
    "UUID, bare": "uuid " + UUID,
    "UUID, uppercase": "GPU-" + UUID.upper(),
    "serial, bare": "board 1654922000000 ok",
    "serial, other label": "serial=1654922000000",
}


@pytest.mark.parametrize("text", FORMS.values(), ids=FORMS.keys())
def test_the_nodes_identifiers_are_found_and_redacted_in_every_form(text: str) -> None:
    """Measured before: each of these survived redaction and the leak check did not see it."""
    redactor = protected()
    assert redactor.leaks(text), "the leak check misses it"
    out = redactor.text(text)
    assert redactor.leaks(out) == [], out
    assert out != text


UNKNOWN = {
    "peer's EC2 name beside its address": ("peer ip-10-1-2-3.ec2.internal at 10.1.2.3", ["10-1-2-3", "10.1.2.3"]),
    "peer's MAC, dashed": ("neighbour 0a-3f-5c-99-88-77", ["0a-3f-5c-99-88-77"]),
    "peer's MAC, dotted": ("neighbour 0a3f.5c99.8877", ["0a3f.5c99.8877"]),
    "a UUID, lowercase prefix": ("gpu-22222222-3333-4444-5555-666666666666 fell off", ["22222222-3333"]),
    "a UUID, bare": ("pod 22222222-3333-4444-5555-666666666666", ["22222222-3333"]),
    "a serial, without Serial Number:": ("GPU serial 1320921031911 board", ["1320921031911"]),
    "a serial, S/N": ("S/N: 1320921031911", ["1320921031911"]),
}


@pytest.mark.parametrize("text, originals", UNKNOWN.values(), ids=UNKNOWN.keys())
def test_values_the_capture_meets_first_in_free_text_are_redacted_in_every_form(
        text: str, originals: list[str]) -> None:
    redactor = Redactor()
    out = redactor.text(text)
    for original in originals:
        assert original.lower() not in out.lower(), out
    assert redactor.leaks(text)  # and once met, found in any form


def test_one_identifier_one_pseudonym_whatever_its_form() -> None:
    redactor = protected()
    colon = redactor.mac(MAC)
    assert redactor.text("0a-3f-5c-21-7e-01") == colon.replace(":", "-")
    assert redactor.text("0a3f.5c21.7e01") == colon.replace(":", "")[:4] + "." + colon.replace(":", "")[4:8] + \
        "." + colon.replace(":", "")[8:]
    gpu = redactor.gpu_uuid("GPU-" + UUID)
    assert redactor.text("gpu-" + UUID) == "gpu-" + gpu[4:] and redactor.text(UUID) == gpu[4:]
    dotted = redactor.ipv4("10.1.2.3")
    assert redactor.text("ip-10-1-2-3.ec2.internal") == "ip-" + dotted.replace(".", "-") + ".ec2.internal"
