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

logger = logging.getLogger("fleetscope.sources.netstat")


@dataclass(frozen=True)
class NetstatReading:
    """``(section, field) -> value`` from both files, e.g. ``("Tcp", "RetransSegs")``."""

    values: Mapping[tuple[str, str], int]

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
                values[(section, name)] = int(number)
            except ValueError:
                logger.debug("netstat: %s.%s is not an integer: %r", section, name, number[:40])
    return values


def read_netstat(procfs: Root) -> NetstatReading:
    """Counters of both files; raises :class:`SourceError` if neither can be read."""
    values: dict[tuple[str, str], int] = {}
    errors: list[str] = []
    for name in ("snmp", "netstat"):
        try:
            values.update(parse_pairs(procfs.read_file("net", name)))
        except Unreadable as exc:
            errors.append(str(exc))
    if len(errors) == 2:
        raise SourceError("; ".join(errors))
    return NetstatReading(values)
