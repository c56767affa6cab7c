"""Pseudo-filesystem access rooted at the configured mount points.

sysfs attributes are read with a single bounded ``read()``: a broken driver
can answer EAGAIN or stream forever, and an attribute is one page at most.
procfs files are read whole without ``stat`` (their size reads as 0).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

SYSFS_READ_LIMIT = 4096


class Unreadable(Exception):
    """One attribute could not be read or parsed; callers skip that value only."""


@dataclass(frozen=True)
class Root:
    """A mount point (``/sys``, ``/proc`` or a fixture tree) that every path is built from."""

    mount: str

    def path(self, *parts: str) -> str:
        return os.path.join(self.mount, *(p.lstrip("/") for p in parts))

    def exists(self, *parts: str) -> bool:
        return os.path.exists(self.path(*parts))

    def listdir(self, *parts: str) -> list[str]:
        """Sorted entries, or [] if the directory is absent (a device may vanish mid-read).

        A directory that is there but cannot be listed (a symlink loop, EIO, EACCES) raises
        :class:`Unreadable`, so the caller can lose that one device rather than everything.
        """
        path = self.path(*parts)
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise Unreadable(f"{path}: {exc.strerror or exc}") from None

    def read_attr(self, *parts: str) -> str:
        """A sysfs attribute's text, stripped. Raises :class:`Unreadable`."""
        path = self.path(*parts)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise Unreadable(f"{path}: {exc.strerror or exc}") from None
        try:
            data = os.read(fd, SYSFS_READ_LIMIT)
        except OSError as exc:
            # EINVAL / EOPNOTSUPP / EAGAIN / EIO: the driver refused this attribute.
            raise Unreadable(f"{path}: {errno.errorcode.get(exc.errno or 0, exc.strerror)}") from None
        finally:
            os.close(fd)
        try:
            return data.decode("ascii", "strict").strip()
        except UnicodeDecodeError:
            raise Unreadable(f"{path}: not text") from None

    def read_attrs(self, *parts: str) -> dict[str, bytes | None] | None:
        """Every file of one sysfs directory, each read raw with one bounded ``read()``, by sorted name.

        None when the directory is absent; a file that cannot be opened or read (the driver refused it,
        a FIFO, no permission) maps to None. The directory is opened once and each file relative to it,
        so a directory of a thousand counters costs no path walks. A directory that is there but cannot
        be listed raises :class:`Unreadable`, as :meth:`listdir` does.
        """
        path = self.path(*parts)
        try:
            directory = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return {} if os.path.exists(path) else None  # listdir's view: a file there lists as empty
        except OSError as exc:
            raise Unreadable(f"{path}: {exc.strerror or exc}") from None
        try:
            try:
                names = sorted(os.listdir(directory))
            except OSError as exc:
                raise Unreadable(f"{path}: {exc.strerror or exc}") from None
            contents: dict[str, bytes | None] = {}
            for name in names:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK, dir_fd=directory)
                except OSError:
                    contents[name] = None
                    continue
                try:
                    contents[name] = os.read(fd, SYSFS_READ_LIMIT)
                except OSError:
                    contents[name] = None  # EINVAL / EOPNOTSUPP / EAGAIN / EIO
                finally:
                    os.close(fd)
            return contents
        finally:
            os.close(directory)

    def read_int(self, *parts: str, base: int = 10) -> int:
        text = self.read_attr(*parts)
        try:
            return int(text, base)
        except ValueError:
            raise Unreadable(f"{self.path(*parts)}: not an integer: {text[:40]!r}") from None

    def read_attr_or_none(self, *parts: str) -> str | None:
        try:
            return self.read_attr(*parts)
        except Unreadable:
            return None

    def read_file(self, *parts: str) -> str:
        """A whole procfs file. Raises :class:`Unreadable`."""
        path = self.path(*parts)
        try:
            with open(path, "rb") as handle:
                return handle.read().decode("utf-8", "replace")
        except OSError as exc:
            raise Unreadable(f"{path}: {exc.strerror or exc}") from None

    def link_target(self, *parts: str) -> str | None:
        """Basename of a symlink's target (e.g. a PCI address), or None."""
        try:
            return os.path.basename(os.readlink(self.path(*parts)).rstrip("/"))
        except OSError:
            return None
