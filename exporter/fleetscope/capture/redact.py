"""Pseudonyms for everything in a capture that identifies a host, its network or its hardware.

One :class:`Redactor` serves one capture. Each identifying value gets a pseudonym of the same shape (a MAC
stays a MAC, a GPU UUID a UUID), the same one wherever the value appears (a GPU's UUID from NVML and from
the kernel log, an interface's MAC), so replayed series keep their identity and their joins. Pseudonyms
are keyed with a random secret that never leaves the process: nothing in the archive can be turned back
into the original, and two captures of the same node do not share pseudonyms. The user who captured can
keep the table (``--mapping FILE``) to translate a pseudonym in a bug discussion back to their host.

Structured values (an interface's ``address``, an EFA ``node_guid``, NVML's UUID and serial) are mapped
where they are read. Free text (the kernel log) is also searched for IPv4/IPv6/MAC addresses, UUIDs,
serials and for every value registered so far, and :meth:`leaks` finds any original left anywhere before a
byte is written.

An identifier is written in more than one way, and every way is both redacted and searched for: a MAC
with colons, dashes, dots (``0a3f.5c21.7e01``) or bare, in either case; an IPv4 address dotted or dashed
(EC2 host names, ``ip-10-1-2-3``); a UUID with ``GPU-``, ``gpu-``, ``MIG-`` or no prefix; a host name whole
or as its first label (the short name), in any case. One identifier has one pseudonym, written in the
original's notation.
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
# The same MAC with dashes (Windows, some firmware) or in three dotted groups (switches); bare 12-digit
# forms are too common among hex numbers to look for unless the MAC is already known.
MAC_OTHER_RE = re.compile(
    r"(?<![0-9A-Za-z.:-])(?:(?:[0-9A-Fa-f]{2}-){5}[0-9A-Fa-f]{2}|[0-9A-Fa-f]{4}\.[0-9A-Fa-f]{4}\.[0-9A-Fa-f]{4})"
    r"(?![0-9A-Za-z.:-])")
IPV4_RE = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
EC2_NAME_RE = re.compile(r"(?<![0-9A-Za-z-])(ip-)(\d{1,3}-\d{1,3}-\d{1,3}-\d{1,3})(?![0-9-])", re.IGNORECASE)
IPV6_RE = re.compile(r"(?<![0-9A-Fa-f:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![0-9A-Fa-f:.])")
UUID_RE = re.compile(r"(?<![0-9A-Za-z])(?:(?:GPU|MIG)-)?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
                     r"(?![0-9A-Za-z])", re.IGNORECASE)
# A serial after a word that says so: "Serial Number: X", "serial X", "serial=X", "S/N: X", "SN#X".
SERIAL_LINE_RE = re.compile(
    r"(\b(?:serial(?:[ _-]?(?:number|no\.?|num))?|s/n|sn)(?:\s*[:=#]\s*|\s+))([A-Za-z0-9][A-Za-z0-9-]{5,})",
    re.IGNORECASE)
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
    # every form of every original as one pattern, rebuilt when an original is added
    _pattern: re.Pattern[str] | None = None
    _forms: dict[str, tuple[str, str]] = field(default_factory=dict)
    _pattern_for: int = -1

    # -- structured values -----------------------------------------------------------------------

    def mac(self, value: str) -> str:
        """A MAC's pseudonym, in the original's notation (colons, dashes, dots or bare)."""
        digits = re.sub(r"[:.-]", "", value).lower()
        if not re.fullmatch(r"[0-9a-f]{12}", digits):
            return value
        canonical = ":".join(digits[i:i + 2] for i in range(0, 12, 2))
        if canonical in UNCHANGED:
            return value
        pseudonym = self._pseudonym("mac", canonical,
                                    lambda d: "02:" + ":".join(d[i:i + 2] for i in range(0, 10, 2)))
        return _mac_like(pseudonym, value)

    def node_guid(self, value: str) -> str:
        if not re.fullmatch(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}", value):
            return value
        return self._pseudonym("node_guid", value.lower(),
                               lambda d: ":".join(d[i:i + 4] for i in range(0, 16, 4)))

    def gpu_uuid(self, value: str) -> str:
        """A UUID's pseudonym with the original's prefix (``GPU-``, ``gpu-``, ``MIG-``, none): one per UUID."""
        if not value:
            return value
        prefix, core = ("", value) if len(value) == 36 else (value[:-36], value[-36:])
        if not re.fullmatch(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", core):
            prefix, core = ("GPU-", value)  # not a UUID's shape: still one pseudonym per value
        pseudonym = self._pseudonym("gpu_uuid", core.lower(),
                                    lambda d: f"{d[0:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}")
        return prefix + pseudonym

    def gpu_serial(self, value: str) -> str:
        if not value:
            return value
        width = max(len(value), 8)
        return self._pseudonym("gpu_serial", value, lambda d: str(int(d, 16))[-width:].rjust(width, "0"))

    def ipv4(self, value: str) -> str:
        """An address's pseudonym, dotted or dashed as the original (``10-1-2-3`` in ``ip-10-1-2-3``)."""
        dashed = "-" in value
        # 198.18.0.0/15: the benchmarking range, never a real host's address
        pseudonym = self._pseudonym("ipv4", value.replace("-", "."),
                                    lambda d: str(ipaddress.IPv4Address(0xC6120000 | (int(d[:5], 16) & 0x1FFFF))))
        return pseudonym.replace(".", "-") if dashed else pseudonym

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
            names = [value, value.split(".", 1)[0]] if kind == "hostname" else [value]  # the short name too
            for name in names:
                if not name or len(name) < MIN_SECRET or (kind == "hostname" and not _distinctive(name)):
                    continue
                mapper(name)

    # -- free text -------------------------------------------------------------------------------

    def text(self, text: str) -> str:
        """Free text with every address found and every registered original replaced by its pseudonym."""
        text = UUID_RE.sub(lambda m: self.gpu_uuid(m.group(0)), text)
        text = MAC_RE.sub(lambda m: self.mac(m.group(0)), text)
        text = MAC_OTHER_RE.sub(lambda m: self.mac(m.group(0)), text)
        text = SERIAL_LINE_RE.sub(
            lambda m: m.group(1) + self.gpu_serial(m.group(2)) if any(c.isdigit() for c in m.group(2))
            else m.group(0), text)
        text = IPV4_RE.sub(lambda m: self.ipv4(m.group(0)) if _is_ipv4(m.group(0)) else m.group(0), text)
        text = EC2_NAME_RE.sub(
            lambda m: m.group(1) + self.ipv4(m.group(2)) if _is_ipv4(m.group(2).replace("-", ".")) else m.group(0),
            text)
        text = IPV6_RE.sub(lambda m: self.ipv6(m.group(0)) if _is_ipv6(m.group(0)) else m.group(0), text)
        text = PROCESS_RE.sub(lambda m: m.group(1) + self.process(m.group(2)), text)
        return self._replace_known(text)

    def _known(self) -> tuple[re.Pattern[str] | None, dict[str, tuple[str, str]]]:
        """One pattern for every form of every registered original, and form -> (kind, pseudonym form)."""
        if self._pattern_for != len(self._by_original):
            forms: dict[str, tuple[str, str]] = {}
            for (kind, original), pseudonym in self._by_original.items():
                if kind == "process" or len(original) < MIN_SECRET:
                    continue  # process names are only replaced where the log names a process
                for form, replacement in zip(_forms(kind, original), _forms(kind, pseudonym), strict=True):
                    forms.setdefault(form.lower(), (kind, replacement))
            alternatives = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
            self._pattern = re.compile(rf"(?<![0-9A-Za-z])(?:{alternatives})(?![0-9A-Za-z])", re.IGNORECASE) \
                if forms else None
            self._forms, self._pattern_for = forms, len(self._by_original)
        return self._pattern, self._forms

    def _replace_known(self, text: str) -> str:
        pattern, forms = self._known()
        return text if pattern is None else pattern.sub(lambda m: forms[m.group(0).lower()][1], text)

    def leaks(self, text: str) -> list[str]:
        """Kinds of originals still present in ``text``, in any form (never the values themselves)."""
        pattern, forms = self._known()
        return [] if pattern is None else sorted({forms[m.group(0).lower()][0] for m in pattern.finditer(text)})

    # -- the table -------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind, _ in self._by_original:
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


def _forms(kind: str, value: str) -> list[str]:
    """The ways one identifier is written: the same list, in the same order, for an original and its pseudonym."""
    if kind == "mac":
        digits = value.replace(":", "")
        return [value, value.replace(":", "-"), digits, f"{digits[:4]}.{digits[4:8]}.{digits[8:]}"]
    if kind == "ipv4":
        return [value, value.replace(".", "-")]
    return [value]


def _mac_like(canonical: str, original: str) -> str:
    """``canonical`` (colons) in the notation of ``original``."""
    digits = canonical.replace(":", "")
    if "-" in original:
        return canonical.replace(":", "-")
    if "." in original:
        return f"{digits[:4]}.{digits[4:8]}.{digits[8:]}"
    return canonical if ":" in original else digits


def _distinctive(hostname: str) -> bool:
    """A host name worth searching for: not ``localhost``, and with a digit, a dot or 8+ letters (a node
    called ``gpu`` identifies nothing, and searching for it would refuse half the captures)."""
    return hostname.lower() not in ("localhost", "localhost.localdomain") and (
        any(c.isdigit() or c == "." for c in hostname) or len(hostname) >= 8)


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
