"""Pseudonyms for everything in a capture that identifies a host, its network or its hardware.

One :class:`Redactor` serves one capture. Each identifying value gets a pseudonym of the same shape (a MAC
stays a MAC, a GPU UUID a UUID), the same one wherever the value appears (a GPU's UUID from NVML and from
the kernel log, an interface's MAC), so replayed series keep their identity and their joins. Pseudonyms
are keyed with a random secret that never leaves the process: nothing in the archive can be turned back
into the original, and two captures of the same node do not share pseudonyms. The user who captured can
keep the table (``--mapping FILE``) to translate a pseudonym in a bug discussion back to their host.

Structured values (an interface's ``address``, an EFA ``node_guid``, NVML's UUID and serial) are mapped
where they are read. Free text (the kernel log) is also searched for IPv4/IPv6/MAC addresses and for
every value registered so far, and :meth:`leaks` finds any original left anywhere before a byte is written.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

MAC_RE = re.compile(r"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}(?![0-9A-Fa-f:])")
IPV4_RE = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
IPV6_RE = re.compile(r"(?<![0-9A-Fa-f:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![0-9A-Fa-f:.])")
UUID_RE = re.compile(r"\b(?:GPU|MIG)-[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\b")
SERIAL_LINE_RE = re.compile(r"(Serial Number:\s*)(\S+)")
PROCESS_RE = re.compile(r"(\bname=)([^,\s]+)")
# Programs every training node runs: kept as they are in kernel-log lines, any other name is replaced.
COMMON_PROCESSES = frozenset({
    "<unknown>", "python", "python3", "pt_main_thread", "torchrun", "nvidia-smi", "nv-hostengine", "dcgmi",
    "nvidia-persistenced", "nvidia-fabricmanager", "nv-fabricmanager", "Xorg", "kworker",
})
UNCHANGED = frozenset({"00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff"})
MIN_SECRET = 4  # shorter strings are too common to search for safely


@dataclass
class Redactor:
    """Pseudonyms of one capture, by kind: ``mac``, ``node_guid``, ``gpu_uuid``, ``gpu_serial``, ``ipv4``,
    ``ipv6``, ``hostname``, ``process``, ``host_id``."""

    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _by_original: dict[tuple[str, str], str] = field(default_factory=dict)
    _used: set[str] = field(default_factory=set)

    # -- structured values -----------------------------------------------------------------------

    def mac(self, value: str) -> str:
        if value.lower() in UNCHANGED or not MAC_RE.fullmatch(value):
            return value
        return self._pseudonym("mac", value.lower(),
                               lambda d: "02:" + ":".join(d[i:i + 2] for i in range(0, 10, 2)))

    def node_guid(self, value: str) -> str:
        if not re.fullmatch(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}", value):
            return value
        return self._pseudonym("node_guid", value.lower(),
                               lambda d: ":".join(d[i:i + 4] for i in range(0, 16, 4)))

    def gpu_uuid(self, value: str) -> str:
        if not value:
            return value
        prefix = value.split("-", 1)[0] if value[:4] in ("GPU-", "MIG-") else "GPU"
        return self._pseudonym("gpu_uuid", value.lower(),
                               lambda d: f"{prefix}-{d[0:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}")

    def gpu_serial(self, value: str) -> str:
        if not value:
            return value
        width = max(len(value), 8)
        return self._pseudonym("gpu_serial", value, lambda d: str(int(d, 16))[-width:].rjust(width, "0"))

    def ipv4(self, value: str) -> str:
        # 198.18.0.0/15: the benchmarking range, never a real host's address
        return self._pseudonym("ipv4", value,
                               lambda d: str(ipaddress.IPv4Address(0xC6120000 | (int(d[:5], 16) & 0x1FFFF))))

    def ipv6(self, value: str) -> str:
        # 2001:db8::/32: the documentation prefix
        return self._pseudonym("ipv6", value.lower(),
                               lambda d: str(ipaddress.IPv6Address((0x20010DB8 << 96) | int(d[:24], 16))))

    def hostname(self, value: str) -> str:
        return self._pseudonym("hostname", value.lower(), lambda d: f"host-{d[:8]}")

    def process(self, value: str) -> str:
        if value in COMMON_PROCESSES:
            return value
        return self._pseudonym("process", value, lambda d: f"proc-{d[:6]}")

    def host_id(self, value: str) -> str:
        """Instance ids, board serials, product UUIDs: never written, only searched for."""
        return self._pseudonym("host_id", value, lambda d: f"id-{d[:12]}")

    def protect(self, kind: str, values: Iterable[str]) -> None:
        """Register host identities (names, addresses) so free text is searched for them and leaks are found."""
        mapper = {"hostname": self.hostname, "ipv4": self.ipv4, "ipv6": self.ipv6, "mac": self.mac,
                  "host_id": self.host_id}[kind]
        for value in values:
            if not value or len(value) < MIN_SECRET or (kind == "hostname" and not _distinctive(value)):
                continue
            mapper(value)
            if kind == "ipv4":  # EC2 host names spell the address with dashes (ip-10-1-2-3)
                self._by_original[("ipv4_dashed", value.replace(".", "-"))] = self.ipv4(value).replace(".", "-")

    # -- free text -------------------------------------------------------------------------------

    def text(self, text: str) -> str:
        """Free text with every address found and every registered original replaced by its pseudonym."""
        text = UUID_RE.sub(lambda m: self.gpu_uuid(m.group(0)), text)
        text = SERIAL_LINE_RE.sub(lambda m: m.group(1) + self.gpu_serial(m.group(2)), text)
        text = MAC_RE.sub(lambda m: self.mac(m.group(0)), text)
        text = IPV4_RE.sub(lambda m: self.ipv4(m.group(0)) if _is_ipv4(m.group(0)) else m.group(0), text)
        text = IPV6_RE.sub(lambda m: self.ipv6(m.group(0)) if _is_ipv6(m.group(0)) else m.group(0), text)
        text = PROCESS_RE.sub(lambda m: m.group(1) + self.process(m.group(2)), text)
        return self._replace_known(text)

    def _replace_known(self, text: str) -> str:
        for (kind, original), pseudonym in sorted(self._by_original.items(), key=lambda kv: -len(kv[0][1])):
            if kind == "process" or len(original) < MIN_SECRET:
                continue  # process names are only replaced where the log names a process
            text = _boundary(original).sub(pseudonym, text)
        return text

    def leaks(self, text: str) -> list[str]:
        """Kinds of originals still present in ``text`` (never the values themselves)."""
        found = set()
        for kind, original in self._by_original:
            if kind != "process" and len(original) >= MIN_SECRET and _boundary(original).search(text):
                found.add(kind)
        return sorted(found)

    # -- the table -------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind, _ in self._by_original:
            if kind != "ipv4_dashed":
                out[kind] = out.get(kind, 0) + 1
        return dict(sorted(out.items()))

    def mapping(self) -> dict[str, dict[str, str]]:
        """kind -> {pseudonym: original}: for the person who captured, never for the archive."""
        out: dict[str, dict[str, str]] = {}
        for (kind, original), pseudonym in self._by_original.items():
            out.setdefault(kind, {})[pseudonym] = original
        return out

    def _pseudonym(self, kind: str, original: str, shape: Callable[[str], str]) -> str:
        known = self._by_original.get((kind, original))
        if known is not None:
            return known
        candidate = original
        for attempt in range(1000):
            digest = hmac.new(self.key, f"{kind}\0{original}\0{attempt}".encode(), hashlib.sha256).hexdigest()
            candidate = shape(digest)
            if candidate not in self._used and candidate.lower() != original.lower():
                break
        self._used.add(candidate)
        self._by_original[(kind, original)] = candidate
        return candidate


def _distinctive(hostname: str) -> bool:
    """A host name worth searching for: not ``localhost``, and with a digit, a dot or 8+ letters (a node
    called ``gpu`` identifies nothing, and searching for it would refuse half the captures)."""
    return hostname.lower() not in ("localhost", "localhost.localdomain") and (
        any(c.isdigit() or c == "." for c in hostname) or len(hostname) >= 8)


def _boundary(value: str) -> re.Pattern[str]:
    return re.compile(r"(?<![0-9A-Za-z])" + re.escape(value) + r"(?![0-9A-Za-z])", re.IGNORECASE)


def _is_ipv4(text: str) -> bool:
    try:
        address = ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return not (address.is_unspecified or address.is_loopback)


def _is_ipv6(text: str) -> bool:
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return not (address.is_unspecified or address.is_loopback)
