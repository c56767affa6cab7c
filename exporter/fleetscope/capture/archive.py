"""Take a node's snapshot, redact it, write it as one ``.tar.gz``; open one again for a replay.

An archive holds one directory, ``fleetscope-capture/``::

    manifest.json   format and version, fleetscope version, when, kernel and instance type, the daemon
                    settings that shape /metrics, what was kept and what the kernel refused, how many
                    values of each kind were redacted, NVML call counts and times, problems met
    README.txt      what this is and how to replay it
    sys/  proc/     the files the readers read, at their real paths, links kept (see capture.files)
    kmsg            the driver's kernel-log records (NVRM lines), /dev/kmsg format
    nvml.yaml       a scenario for the NVML fake with every value and return code NVML gave
    ena.json        the ENA driver statistics (an ioctl on the node, a file in the replay)

Nothing is written before every file has passed :meth:`Redactor.leaks`: an archive that would still hold
a host name, an address, a MAC, a GUID, a GPU UUID or serial is refused with an error naming the kind.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import platform
import shutil
import socket
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetscope import __version__
from fleetscope.capture.files import KernelLog, TreeCopy, copy_procfs, copy_sysfs, read_kernel_log
from fleetscope.capture.nvml import NvmlCapture, capture_nvml
from fleetscope.capture.redact import Redactor
from fleetscope.config import Config
from fleetscope.sources.fs import Root
from fleetscope.sources.pci import list_gpus

FORMAT = "fleetscope-capture"
FORMAT_VERSION = 1
TOP = "fleetscope-capture"
MAX_ARCHIVE_BYTES = 512 * 1024 * 1024  # unpacked; a p5 capture is well under 1 MiB
# Daemon settings that change what /metrics holds (never paths, addresses, tokens or the log level).
CAPTURED_SETTINGS = ("collector.", "net.", "efa.", "gpu.expected-count", "gpu.xid-window", "gpu.lost-retry",
                     "gpu.kmsg", "collection.")
DMI_PUBLIC = ("product_name", "sys_vendor")
DMI_SECRET = ("product_uuid", "product_serial", "board_serial", "board_asset_tag", "chassis_serial",
              "chassis_asset_tag")

EnaReader = Callable[[], Any]  # () -> fleetscope.sources.ethtool.EthtoolReading


class CaptureError(Exception):
    """A capture cannot be written or read; the message says why."""


@dataclass
class Snapshot:
    """What was read from the node, unredacted (it never leaves memory in this form)."""

    sysfs: TreeCopy
    procfs: TreeCopy
    kernel_log: KernelLog
    nvml: NvmlCapture
    ena: dict[str, Any]
    settings: dict[str, Any]
    node: dict[str, str]
    secrets: dict[str, list[str]] = field(default_factory=dict)  # kind -> host identities to keep out
    created: float = field(default_factory=time.time)


# -- taking ---------------------------------------------------------------------------------------


def take_snapshot(config: Config, *, ena_reader: EnaReader | None = None, nvml: bool = True,
                  nvml_timeout: float = 5.0, gpm_interval: float = 1.0, event_wait: float = 0.5) -> Snapshot:
    """Read everything a capture keeps, with the daemon's own paths and interface selection."""
    from fleetscope.config import settings_table

    sysfs = copy_sysfs(config.path.sysfs, config.net.device_include, config.net.device_exclude)
    procfs = copy_procfs(config.path.procfs)
    kernel_log = read_kernel_log(config.path.kmsg) if config.gpu.kmsg else KernelLog((), 0, "gpu.kmsg is off")
    # GPUs on the PCI bus in NVML's order, as the PCI reader lists them: places a GPU NVML cannot identify
    sysfs_gpus = [(g.pci.domain, g.pci.bus, g.pci.device) for g in list_gpus(Root(config.path.sysfs))]
    nvml_capture = (capture_nvml(sysfs_gpus, nvml_timeout, gpm_interval, event_wait) if nvml
                    else NvmlCapture(None, "not captured (--no-nvml)"))
    settings = {key: _setting(config, key) for key, info in settings_table().items()
                if key.startswith(CAPTURED_SETTINGS) and _setting(config, key) != info.default}
    return Snapshot(sysfs, procfs, kernel_log, nvml_capture, _read_ena(config, ena_reader), settings,
                    _node_facts(config), _host_secrets(config))


def _setting(config: Config, key: str) -> Any:
    """A setting's value by its key (``gpu.expected-count``, ``collector.efa.interval``)."""
    parts = key.split(".")
    if parts[0] == "collector":
        settings = config.collector(parts[1])
        return settings.enabled if len(parts) == 2 else getattr(settings, parts[2])
    section = {"net": config.net, "efa": config.efa, "gpu": config.gpu, "collection": config.collection}[parts[0]]
    return getattr(section, parts[1].replace("-", "_"))


def _read_ena(config: Config, reader: EnaReader | None) -> dict[str, Any]:
    from fleetscope.errors import NoHardware, SourceError

    if "ena" not in config.enabled_collectors():
        return {"error": "the ena collector is off"}
    try:
        if reader is None:
            from fleetscope.collectors.ena import ENA_DRIVERS
            from fleetscope.sources.ethtool import read_with_socket

            reading = read_with_socket(Root(config.path.sysfs), ENA_DRIVERS, config.net.device_include,
                                       config.net.device_exclude)
        else:
            reading = reader()
    except (OSError, SourceError, NoHardware) as exc:
        return {"error": str(exc)}
    return {
        "interfaces": [{"device": i.device, "driver": i.driver, "stats": dict(i.stats)} for i in reading.interfaces],
        "unreadable": [{"device": u.device, "driver": u.driver, "reason": u.reason} for u in reading.unreadable],
    }


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(4096).strip()
    except OSError:
        return ""


def _node_facts(config: Config) -> dict[str, str]:
    """Kernel release, CPU architecture and instance type: what a bug report needs, nothing identifying."""
    dmi = os.path.join(config.path.sysfs, "devices", "virtual", "dmi", "id")
    facts = {"kernel": _read_text(os.path.join(config.path.procfs, "sys", "kernel", "osrelease"))
             or platform.release(), "machine": platform.machine()}
    for name in DMI_PUBLIC:
        value = _read_text(os.path.join(dmi, name))
        if value:
            facts[name] = value
    return facts


def _host_secrets(config: Config) -> dict[str, list[str]]:
    """This host's names, addresses and hardware ids: searched for in everything written, never kept."""
    names = {socket.gethostname(), _read_text("/proc/sys/kernel/hostname")}
    for procfs in {config.path.procfs, "/proc"}:
        names.add(_read_text(os.path.join(procfs, "sys", "kernel", "hostname")))
    ipv4: set[str] = set()
    ipv6: set[str] = set()
    for procfs in {config.path.procfs, "/proc"}:
        ipv4 |= _local_ipv4(_read_all(os.path.join(procfs, "net", "fib_trie")))
        for line in _read_all(os.path.join(procfs, "net", "if_inet6")).splitlines():
            raw = line.split()[0] if line.split() else ""
            if len(raw) == 32:
                ipv6.add(":".join(raw[i:i + 4] for i in range(0, 32, 4)))
    macs = set()
    net = os.path.join(config.path.sysfs, "class", "net")
    for interface in sorted(os.listdir(net)) if os.path.isdir(net) else []:
        macs.add(_read_text(os.path.join(net, interface, "address")))
    dmi = os.path.join(config.path.sysfs, "devices", "virtual", "dmi", "id")
    ids = {_read_text(os.path.join(dmi, name)) for name in DMI_SECRET}
    import ipaddress

    def canonical(address: str) -> str:
        try:
            return str(ipaddress.ip_address(address))
        except ValueError:
            return address

    return {"hostname": sorted(n for n in names if n), "ipv4": sorted(a for a in ipv4 if not a.startswith("127.")),
            "ipv6": sorted(canonical(a) for a in ipv6 if canonical(a) not in ("::1", "::")),
            "mac": sorted(m for m in macs if m), "host_id": sorted(i for i in ids if i and i.lower() != "none")}


def _read_all(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(4 * 1024 * 1024)
    except OSError:
        return ""


def _local_ipv4(fib_trie: str) -> set[str]:
    """Addresses ``/proc/net/fib_trie`` marks ``/32 host LOCAL`` (the host's own)."""
    out: set[str] = set()
    previous = ""
    for line in fib_trie.splitlines():
        text = line.strip()
        if text.startswith("|--"):
            previous = text[3:].strip()
        elif text.startswith("/32 host LOCAL") and previous:
            out.add(previous)
    return out


# -- rendering ------------------------------------------------------------------------------------


@dataclass
class Rendered:
    """The archive's content, redacted: relative path -> bytes (files), link text (links), None (dirs)."""

    files: dict[str, bytes]
    links: dict[str, str]
    dirs: set[str]
    manifest: dict[str, Any]
    redactor: Redactor


def render(snapshot: Snapshot, redactor: Redactor | None = None) -> Rendered:
    redactor = redactor or Redactor()
    for kind, values in snapshot.secrets.items():
        redactor.protect(kind, values)
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}
    dirs: set[str] = set()
    for prefix, tree in (("sys", snapshot.sysfs), ("proc", snapshot.procfs)):
        for path, data in tree.files.items():
            files[f"{prefix}/{path}"] = _redact_attribute(redactor, path, data)
        links.update({f"{prefix}/{path}": text for path, text in tree.links.items()})
        dirs |= {f"{prefix}/{path}" for path in tree.dirs}
        dirs |= {f"{prefix}/{path}" for path in tree.unreadable}  # refused: an empty directory reads as refused
    scenario = _redact_scenario(redactor, snapshot.nvml.scenario)
    if scenario is not None:
        files["nvml.yaml"] = _scenario_yaml(scenario).encode()
    kmsg = "".join(redactor.text(line) + "\n" for line in snapshot.kernel_log.records)
    if not snapshot.kernel_log.error:
        files["kmsg"] = kmsg.encode()
    files["ena.json"] = json.dumps(snapshot.ena, indent=1).encode()  # the driver's order of statistics
    manifest = _manifest(snapshot, redactor)
    files["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    files["README.txt"] = README.encode()
    captured = [data for name, data in files.items() if name != "README.txt"]  # README: our own words
    leaks = sorted({kind for data in [*captured, *(t.encode() for t in links.values())]
                    for kind in redactor.leaks(data.decode("utf-8", "replace"))})
    if leaks:
        raise CaptureError(f"refusing to write a capture that still holds: {', '.join(leaks)}")
    return Rendered(files, links, dirs, manifest, redactor)


def _redact_attribute(redactor: Redactor, path: str, data: bytes) -> bytes:
    name = os.path.basename(path)
    text = data.decode("utf-8", "replace")
    if name == "address" and path.startswith(("class/net/", "devices/")):
        return (redactor.mac(text.strip()) + "\n").encode()
    if name in ("node_guid", "sys_image_guid"):
        value = text.strip()
        return ((value if set(value) <= {"0", ":"} else redactor.node_guid(value)) + "\n").encode()
    return data


def _redact_scenario(redactor: Redactor, scenario: dict[str, Any] | None) -> dict[str, Any] | None:
    if scenario is None:
        return None
    out: dict[str, Any] = json.loads(json.dumps(scenario))  # a deep copy of plain data
    for section in [out.get("defaults", {}), *out.get("gpus", {}).values()]:
        if isinstance(section.get("uuid"), str) and not section["uuid"].startswith("NVML_ERROR_"):
            section["uuid"] = redactor.gpu_uuid(section["uuid"])
        if isinstance(section.get("serial"), str) and not section["serial"].startswith("NVML_ERROR_"):
            section["serial"] = redactor.gpu_serial(section["serial"])
    out["gpus"] = {int(k): v for k, v in out.get("gpus", {}).items()}
    return out


def _scenario_yaml(scenario: dict[str, Any]) -> str:
    import yaml

    header = ("# NVML as fleetscope capture found it: a scenario for fleetscope_sim.nvml_fake (load_scenario).\n"
              "# Values in NVML's units; NVML_ERROR_* where the driver answered that code instead.\n")
    return header + yaml.safe_dump(scenario, sort_keys=False, default_flow_style=None, width=110)


def _manifest(snapshot: Snapshot, redactor: Redactor) -> dict[str, Any]:
    nvml = snapshot.nvml
    scenario = nvml.scenario or {}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "fleetscope_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(snapshot.created)),
        "node": snapshot.node,
        "settings": snapshot.settings,
        "contents": {
            "sys": {"files": len(snapshot.sysfs.files), "links": len(snapshot.sysfs.links),
                    "refused": {f"sys/{p}": r for p, r in sorted(snapshot.sysfs.unreadable.items())}},
            "proc": {"files": sorted(f"proc/{p}" for p in snapshot.procfs.files),
                     "refused": {f"proc/{p}": r for p, r in sorted(snapshot.procfs.unreadable.items())}},
            "kmsg": {"records_read": snapshot.kernel_log.total, "records_kept": len(snapshot.kernel_log.records),
                     "error": snapshot.kernel_log.error},
            "nvml": {"gpus": len(scenario.get("pci_buses", [])), "driver_version": scenario.get("driver_version", ""),
                     "error": nvml.error},
            "ena": {"interfaces": len(snapshot.ena.get("interfaces", [])), "error": snapshot.ena.get("error", "")},
        },
        "redaction": {"method": "keyed pseudonyms of the same shape, consistent within this capture; the key "
                                "was discarded", "replaced": redactor.counts()},
        "nvml_calls": {symbol: {"calls": int(calls), "ms": round(seconds * 1000, 3)}
                       for symbol, (calls, seconds) in sorted(nvml.calls.items())},
        "problems": nvml.problems,
    }


README = """This is a fleetscope capture: the files fleetscope's collectors read on one GPU node, redacted.

Host names, IP and MAC addresses, EFA GUIDs, GPU UUIDs and serials, and unusual process names were
replaced by pseudonyms of the same shape (the same original always by the same pseudonym within this
capture). Nothing else of the host's file systems is included: see manifest.json for what is.

Replay it through the real daemon, on any machine, without GPUs:

    fleetscope simulate-node --from THIS_FILE.tar.gz --listen 127.0.0.1:9402
    curl -s 127.0.0.1:9402/metrics
"""


# -- writing --------------------------------------------------------------------------------------


def write_archive(rendered: Rendered, path: str, mtime: float | None = None) -> None:
    """One deterministic ``.tar.gz``: sorted members, fixed owner and modes, the capture's time."""
    stamp = int(mtime if mtime is not None else time.time())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        parents: set[str] = set()
        for path_ in [*rendered.files, *rendered.links, *rendered.dirs]:
            parts = path_.split("/")
            parents |= {"/".join(parts[:i]) for i in range(1, len(parts))}
        for directory in sorted(parents | rendered.dirs | {""}):
            info = tarfile.TarInfo(f"{TOP}/{directory}".rstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, stamp
            tar.addfile(info)
        for link, target in sorted(rendered.links.items()):
            info = tarfile.TarInfo(f"{TOP}/{link}")
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, stamp
            tar.addfile(info)
        for name, data in sorted(rendered.files.items()):
            info = tarfile.TarInfo(f"{TOP}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, stamp
            tar.addfile(info, io.BytesIO(data))
    write_file(path, gzip.compress(buffer.getvalue(), mtime=stamp), 0o644 & ~_umask())


def write_mapping(rendered: Rendered, path: str) -> None:
    """pseudonym -> original, for the person who captured (owner-only file, never part of the archive)."""
    write_file(path, json.dumps(rendered.redactor.mapping(), indent=1, sort_keys=True).encode(), 0o600)


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_file(path: str, data: bytes, mode: int) -> None:
    """``data`` at ``path``, whole or not at all, as root in a directory other users may write to.

    Only a regular file (or nothing) at ``path`` is replaced: a device node, a FIFO, a directory or a symlink
    there is refused (``-o /dev/full`` once replaced the device). The data goes to a temporary file that
    ``mkstemp`` creates with ``O_EXCL`` (a name nobody can have planted a link at) in the same directory, then
    is renamed over ``path``; on any error the temporary file is removed and :class:`CaptureError` says why in
    one line.
    """
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        existing = None
    except OSError as exc:
        raise CaptureError(f"cannot write {path}: {exc.strerror}") from None
    if existing is not None:
        if stat.S_ISLNK(existing.st_mode):
            raise CaptureError(f"cannot write {path}: it is a symbolic link; give the path it points to")
        if stat.S_ISDIR(existing.st_mode):
            raise CaptureError(f"cannot write {path}: it is a directory; give a file name")
        if not stat.S_ISREG(existing.st_mode):
            raise CaptureError(f"cannot write {path}: it exists and is not a regular file")
    directory, name = os.path.split(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise CaptureError(f"cannot write {path}: {exc.strerror}") from None
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise CaptureError(f"cannot write {path}: {exc.strerror or exc}") from None


# -- reading --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    """An unpacked capture: its directory and manifest."""

    root: str
    manifest: Mapping[str, Any]

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.manifest.get("settings", {}))


def open_capture(source: str, workdir: str) -> Capture:
    """A capture from its ``.tar.gz`` (unpacked below ``workdir``) or from a directory already unpacked."""
    if os.path.isdir(source):
        root = source if os.path.isfile(os.path.join(source, "manifest.json")) else os.path.join(source, TOP)
    else:
        root = _unpack(source, workdir)
    try:
        with open(os.path.join(root, "manifest.json"), encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as exc:
        raise CaptureError(f"{source}: not a fleetscope capture (manifest.json: {exc})") from None
    if manifest.get("format") != FORMAT:
        raise CaptureError(f"{source}: not a fleetscope capture (format {manifest.get('format')!r})")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CaptureError(f"{source}: capture format {version} is newer than this fleetscope reads "
                           f"({FORMAT_VERSION}); upgrade fleetscope to replay it")
    return Capture(root, manifest)


def _unpack(source: str, workdir: str) -> str:
    """Extract only directories, regular files and links that stay inside the capture's directory."""
    destination = os.path.join(workdir, TOP)
    if os.path.exists(destination):
        shutil.rmtree(destination)
    total = 0
    try:
        tar = tarfile.open(source, mode="r:gz")  # noqa: SIM115 - closed by the with below, once it opened
        members = tar.getmembers()
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise CaptureError(f"{source}: cannot open: {exc}") from None
    with tar:
        for member in members:
            name = os.path.normpath(member.name)
            if (name != TOP and not name.startswith(TOP + "/")) or ".." in member.name.split("/") \
                    or os.path.isabs(member.name):
                raise CaptureError(f"{source}: unexpected member {member.name!r}")
            if member.issym():
                target = os.path.normpath(os.path.join(os.path.dirname(name), member.linkname))
                if os.path.isabs(member.linkname) or not (target == TOP or target.startswith(TOP + "/")):
                    raise CaptureError(f"{source}: link {member.name!r} points outside the capture")
            elif not (member.isdir() or member.isfile()):
                raise CaptureError(f"{source}: unexpected member type {member.name!r}")
            total += member.size
            if total > MAX_ARCHIVE_BYTES:
                raise CaptureError(f"{source}: larger than {MAX_ARCHIVE_BYTES >> 20} MiB unpacked")
        for member in members:
            target = os.path.join(workdir, os.path.normpath(member.name))
            if member.isdir():
                os.makedirs(target, exist_ok=True)
            elif member.issym():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(member.linkname, target)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                extracted = tar.extractfile(member)
                assert extracted is not None
                with extracted, open(target, "wb") as handle:
                    shutil.copyfileobj(extracted, handle)
    return destination
