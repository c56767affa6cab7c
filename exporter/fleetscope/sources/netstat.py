"""TCP/IP counters from procfs (``net/snmp``, ``net/netstat``), by section and field name.

Both files are pairs of lines, ``Proto: Name1 Name2 ...`` then
``Proto: v1 v2 ...``. Kernels append fields over time, so values are looked
up by header name, never by position. The files are per network namespace:
the daemon must run in the host's (hostNetwork) to see the node's counters.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from fleetscope.errors import SourceError
from fleetscope.sources.fs import Root, Unreadable

logger = logging.getLogger(__name__)


# The section each file must hold: a file without it (unreadable, empty, garbage) leaves its counters blind.
SECTIONS = (("snmp", "Tcp"), ("netstat", "TcpExt"))
MAX_VALUE = 1 << 64  # counters are 64-bit in the kernel; anything larger is not a counter


@dataclass(frozen=True)
class NetstatReading:
    """``(section, field) -> value`` from both files, e.g. ``("Tcp", "RetransSegs")``.

    ``missing`` names each file that did not yield its section, and why.
    """

    values: Mapping[tuple[str, str], int]
    missing: tuple[str, ...] = ()

    def get(self, key: str) -> int | None:
        section, _, name = key.partition(".")
        return self.values.get((section, name))


def parse_pairs(text: str) -> dict[tuple[str, str], int]:
    """Parse header/value line pairs. A section whose lines do not pair up is skipped whole;
    a field whose value is not an integer is skipped alone."""
    values: dict[tuple[str, str], int] = {}
    lines = [line for line in text.splitlines() if line.strip()]
    index = 0
    while index + 1 < len(lines):
        header, data = lines[index], lines[index + 1]
        section, sep, names_text = header.partition(":")
        data_section, data_sep, numbers_text = data.partition(":")
        if not sep or not data_sep or section != data_section:
            # out of step: resynchronise on the next line
            logger.debug("netstat: unpaired line %r", header[:60])
            index += 1
            continue
        index += 2
        names, numbers = names_text.split(), numbers_text.split()
        if len(names) != len(numbers):
            logger.debug("netstat: section %s has %d names and %d values", section, len(names), len(numbers))
            continue
        for name, number in zip(names, numbers, strict=True):
            try:
                value = int(number)
            except ValueError:
                logger.debug("netstat: %s.%s is not an integer: %r", section, name, number[:40])
                continue
            if abs(value) >= MAX_VALUE:
                logger.debug("netstat: %s.%s is out of a counter's range: %r", section, name, number[:40])
                continue
            values[(section, name)] = value
    return values


def read_netstat(procfs: Root) -> NetstatReading:
    """Counters of both files; raises :class:`SourceError` if neither yields its section."""
    values: dict[tuple[str, str], int] = {}
    missing: list[str] = []
    for name, section in SECTIONS:
        try:
            parsed = parse_pairs(procfs.read_file("net", name))
        except Unreadable as exc:
            missing.append(str(exc))
            continue
        if not any(key[0] == section for key in parsed):
            missing.append(f"{procfs.path('net', name)}: no {section} counters")
        values.update(parsed)
    if len(missing) == len(SECTIONS):
        raise SourceError("; ".join(missing))
    return NetstatReading(values, tuple(missing))
