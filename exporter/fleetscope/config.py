"""The daemon's one typed configuration object.

Every setting has a dotted key (``web.listen-address``) and can come from, in
order of precedence: a command-line flag (``--web.listen-address``), an
environment variable (``FLEETSCOPE_WEB_LISTEN_ADDRESS``), or the YAML file
given with ``--config`` (nested or dotted keys). Unknown keys and bad values
raise :class:`ConfigError` naming the key, so start-up stops with a clear
message instead of running with a surprise.

Settings are declared once, as dataclass fields with a ``key`` in their
metadata; flags, environment variables, YAML keys and the docs all come from
those declarations.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from fleetscope.collectors import REGISTRY, CollectorEntry
from fleetscope.metrics.spec import DETAIL_LEVELS, DetailLevel

ENV_PREFIX = "FLEETSCOPE_"
# Read or written by the training-side client (fleetscope.client), not the daemon: a node may export them to
# every process, and a rank's tracker sets FLEETSCOPE_RANK_PROCESS in its own environment, which a
# `fleetscope check` it starts inherits (#35 item 9), so the daemon must not refuse them as unknown settings.
CLIENT_ENV = frozenset({"FLEETSCOPE_PUSH_URL", "FLEETSCOPE_JOB", "FLEETSCOPE_RANK_PROCESS"})


class ConfigError(ValueError):
    """A setting is unknown or has a value that cannot be used."""


# -- value parsers: each takes the raw value (str from flags/env, any from YAML) --------------------


def parse_str(value: Any) -> str:
    if isinstance(value, (dict, list)):
        raise ValueError("expected a string")
    return "" if value is None else str(value)


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def parse_count(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected a whole number")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise ValueError(f"must be >= 0, got {number}")
    return number


MAX_MEDIAN_WINDOW = 1024


def parse_bounded_count(value: Any, most: int) -> int:
    number = parse_count(value)
    if number > most:
        raise ValueError(f"must be <= {most}, got {number}")
    return number


def parse_seconds(value: Any) -> float:
    """Seconds as a number, or with a Prometheus-style suffix (500ms, 15s, 5m, 1h)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration")
    text = str(value).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", text)
    if not match:
        raise ValueError(f"expected a duration such as 15s or 500ms, got {value!r}")
    number = float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    if number <= 0:
        raise ValueError(f"must be > 0, got {value!r}")
    return number


def parse_regex(value: Any) -> str:
    text = parse_str(value)
    try:
        re.compile(text)
    except re.error as exc:
        raise ValueError(f"invalid regular expression: {exc}") from None
    return text


def parse_address(value: Any) -> str:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port``; empty means "not separate"."""
    text = parse_str(value).strip()
    if text == "":
        return ""
    split_address(text)
    return text


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected host:port, got {address!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def parse_token(value: Any) -> str:
    """A secret as people write it to a file or a variable: surrounding whitespace (``echo``'s newline) is no part
    of it, at either end of the connection."""
    return parse_str(value).strip()


def parse_uids(value: Any) -> tuple[int, ...]:
    """Numeric user ids, comma-separated (or a YAML list); empty for none."""
    items = value if isinstance(value, list) else [] if value is None else str(value).split(",")
    uids = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        if isinstance(item, bool) or not text.isdigit():
            raise ValueError(f"expected numeric user ids separated by commas, got {item!r}")
        uids.append(int(text))
    return tuple(uids)


def setting(key: str, default: Any, parse: Callable[[Any], Any], help: str) -> Any:
    return field(default=default, metadata={"key": key, "parse": parse, "help": help})


# -- sections ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebConfig:
    listen_address: str = setting("web.listen-address", ":9402", parse_address, "Address for /metrics and the API.")
    telemetry_path: str = setting("web.telemetry-path", "/metrics", parse_str, "Path under which metrics are served.")
    max_connections: int = setting(
        "web.max-connections", 512, parse_count,
        "Most open connections per listening address (0: as many as the open files limit leaves); beyond it "
        "the connection that has waited longest on its client is closed.",
    )
    read_header_timeout: float = setting(
        "web.read-header-timeout", 10.0, parse_seconds, "Longest a client may take to send a request's headers.",
    )
    read_timeout: float = setting(
        "web.read-timeout", 30.0, parse_seconds, "Longest a client may take to send a whole request, body included.",
    )
    ready_file: str = setting(
        "web.ready-file", "", parse_str,
        "Once every listener is open, write the addresses they bound to this file (JSON, listener name -> "
        "host:port; with port 0 the kernel's choice), so whoever started the daemon needs no free port; "
        "empty: no file.",
    )
    config_file: str = setting(
        "web.config.file", "", parse_str,
        "Web config file in the exporter-toolkit format (node_exporter's --web.config.file): tls_server_config "
        "and basic_auth_users (bcrypt), for every listener; reloaded when it or its files change (docs/security.md).",
    )
    api_docs: bool = setting(
        "web.api-docs", False, parse_bool,
        "Serve the push API's OpenAPI description and its pages (/openapi.json, /docs); off, they are not served "
        "at all, since they are not behind push.token.",
    )


@dataclass(frozen=True)
class PathConfig:
    sysfs: str = setting("path.sysfs", "/sys", parse_str, "sysfs mount point.")
    procfs: str = setting("path.procfs", "/proc", parse_str, "procfs mount point.")
    kmsg: str = setting("path.kmsg", "/dev/kmsg", parse_str, "Kernel log device or a file with its lines (Xid source).")


@dataclass(frozen=True)
class CollectionConfig:
    staleness: float = setting(
        "collection.staleness", 0.0, lambda v: 0.0 if str(v).strip() in ("0", "") else parse_seconds(v),
        "Drop a collector's series when its last success is older than this (0: 3x its interval + timeout).",
    )
    pause_after: float = setting(
        "collection.pause-after", 300.0, lambda v: 0.0 if str(v).strip() in ("0", "") else parse_seconds(v),
        "Pause a background collector nothing has scraped for this long; the next scrape resumes it (0: never).",
    )


@dataclass(frozen=True)
class NetConfig:
    device_include: str = setting("net.device-include", "", parse_regex, "Only report interfaces matching this regex.")
    device_exclude: str = setting(
        "net.device-exclude",
        r"^(lo|veth.*|cali.*|eni.*|docker.*|cni.*|flannel.*|virbr.*|vxlan.*|tunl.*|kube-ipvs.*|br-.*|lxc.*|genev.*|nodelocaldns.*|cilium.*)$",
        parse_regex,
        "Skip interfaces matching this regex (container-side virtual interfaces by default).",
    )


@dataclass(frozen=True)
class EfaConfig:
    expected_count: int = setting(
        "efa.expected-count", 0, parse_count, "EFA devices this node should have (0: unknown)."
    )


@dataclass(frozen=True)
class GpuConfig:
    expected_count: int = setting("gpu.expected-count", 0, parse_count, "GPUs this node should have (0: unknown).")
    xid_window: float = setting("gpu.xid-window", 3600.0, parse_seconds, "How far back a fatal Xid makes `check` fail.")
    lost_retry: float = setting("gpu.lost-retry", 60.0, parse_seconds, "How often a lost GPU is retried.")
    kmsg: bool = setting("gpu.kmsg", True, parse_bool, "Read Xid errors from the kernel log.")
    slow_interval: float = setting(
        "gpu.slow-interval", 60.0, parse_seconds,
        "How often each GPU's counters and error states are read (energy, throttle time, ECC, row remapping, "
        "recovery action, PCIe and NVLink errors and state); an NVML error event for the GPU reads them at once.",
    )
    unsupported_retry: float = setting(
        "gpu.unsupported-retry", 600.0, parse_seconds,
        "How long a value the GPU answered NOT_SUPPORTED or NO_PERMISSION is not asked for again.",
    )
    pcie_sampler: bool = setting(
        "gpu.pcie-sampler", False, parse_bool,
        "On GPUs without GPM PCIe rates, also sample PCIe throughput with nvmlDeviceGetPcieThroughput "
        "(20 ms per direction, GPU and collection); off, they export the PCIe byte counters.",
    )
    jobs_dir: str = setting(
        "gpu.jobs-dir", "/run/fleetscope/jobs", parse_str,
        "Directory where Slurm prolog scripts record job-to-GPU assignments.",
    )
    pod_resources_socket: str = setting(
        "gpu.pod-resources-socket", "", parse_str,
        "The kubelet's pod-resources socket (/var/lib/kubelet/pod-resources/kubelet.sock, mounted read-only): "
        "label each allocated GPU and MIG device with its pod, namespace and container at the slow interval, "
        "idle or not. Needs the kubelet extra (grpcio, protobuf); empty, off.",
    )


@dataclass(frozen=True)
class NcclConfig:
    dir: str = setting(
        "nccl.dir", "/var/lib/fleetscope/nccl-inspector", parse_str,
        "NCCL Inspector output directory (the jobs' NCCL_INSPECTOR_DUMP_DIR) and its direct subdirectories.",
    )
    ttl: float = setting(
        "nccl.ttl", 900.0, parse_seconds,
        "Forget a communicator that logged nothing, and stop following a file not written, for this long.",
    )
    max_read_bytes: int = setting(
        "nccl.max-read-bytes", 8 << 20, parse_count,
        "Most Inspector output read per collection; a larger backlog is read over several.",
    )
    max_keys: int = setting(
        "nccl.max-keys", 1024, parse_count,
        "Most (rank, communicator, operation, size bucket) totals kept, a quarter of them per process; records "
        "of further ones are skipped.",
    )
    file_owners: tuple[int, ...] = setting(
        "nccl.file-owners", (), parse_uids,
        "User ids whose Inspector files are read even when no live process of theirs wrote them (comma-separated; "
        "empty: only files whose writer process is alive and owns them).",
    )


@dataclass(frozen=True)
class PushConfig:
    listen_address: str = setting(
        "push.listen-address", "", parse_address,
        "Separate address for the push API (empty: served with /metrics).",
    )
    token: str = setting(
        "push.token", "", parse_token,
        "Bearer token required on pushes (empty: none). Every user can read a command line: prefer push.token-file "
        "or the environment.",
    )
    token_file: str = setting(
        "push.token-file", "", parse_str,
        "File holding the bearer token required on pushes (mode 0600; surrounding whitespace ignored).",
    )
    max_body_bytes: int = setting("push.max-body-bytes", 1 << 20, parse_count, "Largest accepted push body.")
    max_inflight_bytes: int = setting(
        "push.max-inflight-bytes", 4 << 20, parse_count,
        "Most body bytes all pushes being read and stored may hold together (at least push.max-body-bytes); "
        "a push beyond it is answered 503 with Retry-After: bounds the daemon's memory under a push storm.",
    )
    max_jobs: int = setting("push.max-jobs", 16, parse_count, "Most jobs tracked at once on this node.")
    max_ranks: int = setting("push.max-ranks", 128, parse_count, "Most ranks tracked at once on this node.")
    rank_ttl: float = setting(
        "push.rank-ttl", 3600.0, parse_seconds, "Drop a rank's series after this long without pushes."
    )
    median_window: int = setting(
        "push.median-window", 32, lambda value: parse_bounded_count(value, MAX_MEDIAN_WINDOW),
        f"Steps in each rank's rolling median (at most {MAX_MEDIAN_WINDOW}: each push copies a rank's windows).",
    )
    group_ttl: float = setting(
        "push.group-ttl", 900.0, parse_seconds, "Drop a Pushgateway-style group after this long."
    )
    max_groups: int = setting("push.max-groups", 64, parse_count, "Most Pushgateway-style groups held at once.")
    max_group_samples: int = setting(
        "push.max-group-samples", 5_000, parse_count, "Most samples one Pushgateway-style group may hold (413 above).",
    )
    max_samples: int = setting(
        "push.max-samples", 10_000, parse_count,
        "Most samples all Pushgateway-style groups may hold together (429 above): bounds memory and scrape time.",
    )
    max_bytes: int = setting(
        "push.max-bytes", 8 << 20, parse_count,
        "Most bytes all Pushgateway-style groups may add to /metrics together (429 above), grouping labels "
        "counted on every sample they are exposed with: bounds /metrics and the daemon's memory.",
    )


def parse_percent(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a percentage")
    try:
        number = float(str(value).strip().removesuffix("%"))
    except ValueError:
        raise ValueError(f"expected a percentage such as 20, got {value!r}") from None
    if not 0 < number <= 100:
        raise ValueError(f"must be above 0 and at most 100, got {value!r}")
    return number


_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'


def parse_matchers(value: Any) -> str:
    """PromQL label matchers as they go between braces: ``job="fleetscope", cluster=~"p5-.*"``."""
    text = parse_str(value).strip()
    if not re.fullmatch(f"{_MATCHER}(?:,{_MATCHER})*", text):
        raise ValueError(f'expected label matchers such as job="fleetscope", got {value!r}')
    return text


def parse_url(value: Any) -> str:
    text = parse_str(value).strip().rstrip("/")
    if text and not re.fullmatch(r"https?://[^\s/?#]+(?:/[^\s?#]*)?", text):
        raise ValueError(f"expected an http(s) URL without query, such as http://prometheus:9090, got {value!r}")
    return text


@dataclass(frozen=True)
class CheckConfig:
    """`fleetscope check`'s cross-node findings: what Prometheus says about this node (docs/deploy.md)."""

    prometheus_url: str = setting(
        "check.prometheus-url", "", parse_url,
        "Prometheus (or a query proxy in front of Amazon Managed Prometheus) that check asks for the fleetscope "
        "alerts about this node; empty: check reports node-local findings only.",
    )
    prometheus_timeout: float = setting(
        "check.prometheus-timeout", 2.0, parse_seconds,
        "Longest check waits for Prometheus in all; no answer by then is \"could not tell\", never unhealthy.",
    )
    prometheus_ca_file: str = setting(
        "check.prometheus-ca-file", "", parse_str,
        "PEM file of the certificate authorities an https check.prometheus-url is verified with (empty: the "
        "system's).",
    )
    prometheus_bearer_token_file: str = setting(
        "check.prometheus-bearer-token-file", "", parse_str,
        "File holding a bearer token check sends to Prometheus (read at each check, so a rotated token is used).",
    )
    prometheus_username: str = setting(
        "check.prometheus-username", "", parse_str,
        "User name for basic auth towards Prometheus (with check.prometheus-password-file).",
    )
    prometheus_password_file: str = setting(
        "check.prometheus-password-file", "", parse_str,
        "File holding the basic auth password towards Prometheus (read at each check).",
    )
    instance: str = setting(
        "check.instance", "", parse_str,
        "This node's `instance` label in Prometheus (empty: the short host name, as the shipped scrape configs "
        "label nodes; the Kubernetes overlay sets the node name).",
    )
    selector: str = setting(
        "check.selector", 'job="fleetscope"', parse_matchers,
        "Label matchers of fleetscope's scrape targets (the rules' selector); add cluster=\"...\" where one "
        "Prometheus holds several clusters that reuse node names.",
    )
    breaker_percent: float = setting(
        "check.breaker-percent", 20.0, parse_percent,
        "Percent of the cluster's nodes (rounded up, one node at least) that may carry one cross-node finding; "
        "above it, check reports the finding as \"could not tell\" on every node: the circuit breaker.",
    )
    breaker_window: float = setting(
        "check.breaker-window", 600.0, parse_seconds,
        "The breaker counts every node that carried the finding at any time within this window.",
    )
    repaired_file: str = setting(
        "check.repaired-file", "/var/lib/fleetscope/repaired", parse_str,
        "Touch this file after repairing the node in place: a finding that rests on days of history (a repeat "
        "straggler) then counts again only once the node is flagged anew.",
    )


LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["logfmt", "json"]
LOG_LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warning", "error")
LOG_FORMATS: tuple[LogFormat, ...] = ("logfmt", "json")


def _choice(value: Any, choices: tuple[str, ...]) -> str:
    text = parse_str(value).strip().lower()
    if text not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
    return text


def parse_log_level(value: Any) -> LogLevel:
    return cast(LogLevel, _choice(value, LOG_LEVELS))


def parse_log_format(value: Any) -> LogFormat:
    return cast(LogFormat, _choice(value, LOG_FORMATS))


@dataclass(frozen=True)
class LogConfig:
    level: LogLevel = setting("log.level", "info", parse_log_level, "Log level: debug, info, warning or error.")
    format: LogFormat = setting(
        "log.format", "logfmt", parse_log_format, "Log line format: logfmt (key=value) or json (one object per line)."
    )


def parse_detail(value: Any) -> DetailLevel:
    text = _choice(value, DETAIL_LEVELS)
    return "all" if text == "all" else "default"


@dataclass(frozen=True)
class CollectorSettings:
    enabled: bool
    interval: float
    timeout: float
    detail: DetailLevel = "default"  # see fleetscope.metrics.detail; only collectors with detail_levels offer a choice


SECTIONS: dict[str, type] = {
    "web": WebConfig,
    "path": PathConfig,
    "collection": CollectionConfig,
    "net": NetConfig,
    "efa": EfaConfig,
    "gpu": GpuConfig,
    "nccl": NcclConfig,
    "push": PushConfig,
    "log": LogConfig,
    "check": CheckConfig,
}


def default_collectors(registry: Mapping[str, CollectorEntry] = REGISTRY) -> dict[str, CollectorSettings]:
    return {
        name: CollectorSettings(entry.default_enabled, entry.default_interval, entry.default_timeout)
        for name, entry in registry.items()
    }


@dataclass(frozen=True)
class Config:
    web: WebConfig = field(default_factory=WebConfig)
    path: PathConfig = field(default_factory=PathConfig)
    collection: CollectionConfig = field(default_factory=CollectionConfig)
    net: NetConfig = field(default_factory=NetConfig)
    efa: EfaConfig = field(default_factory=EfaConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig)
    push: PushConfig = field(default_factory=PushConfig)
    log: LogConfig = field(default_factory=LogConfig)
    check: CheckConfig = field(default_factory=CheckConfig)
    collectors: Mapping[str, CollectorSettings] = field(default_factory=default_collectors)

    def collector(self, name: str) -> CollectorSettings:
        return self.collectors[name]

    def enabled_collectors(self) -> list[str]:
        return [name for name, settings in self.collectors.items() if settings.enabled]

    def staleness_for(self, name: str) -> float:
        if self.collection.staleness > 0:
            return self.collection.staleness
        settings = self.collectors[name]
        return 3 * settings.interval + settings.timeout


# -- the key table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SettingInfo:
    key: str
    default: Any
    parse: Callable[[Any], Any]
    help: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + re.sub(r"[.\-]", "_", self.key).upper()

    @property
    def is_bool(self) -> bool:
        return isinstance(self.default, bool)


def settings_table(registry: Mapping[str, CollectorEntry] = REGISTRY) -> dict[str, SettingInfo]:
    """Every known key, in a stable order: section settings, then per-collector settings."""
    out: dict[str, SettingInfo] = {}
    for cls in SECTIONS.values():
        for f in dataclasses.fields(cls):
            meta = f.metadata
            out[meta["key"]] = SettingInfo(meta["key"], f.default, meta["parse"], meta["help"])
    for name, entry in registry.items():
        out[f"collector.{name}"] = SettingInfo(
            f"collector.{name}", entry.default_enabled, parse_bool, f"Enable the {name} collector ({entry.help})."
        )
        out[f"collector.{name}.interval"] = SettingInfo(
            f"collector.{name}.interval", entry.default_interval, parse_seconds, f"How often the {name} collector runs."
        )
        out[f"collector.{name}.timeout"] = SettingInfo(
            f"collector.{name}.timeout", entry.default_timeout, parse_seconds,
            f"Longest a {name} collection may take before it counts as failed.",
        )
        if entry.detail_levels:
            out[f"collector.{name}.detail"] = SettingInfo(
                f"collector.{name}.detail", "default", parse_detail,
                f"Series the {name} collector exports: default (what every alert and dashboard needs) or all "
                "(every device, port and link; docs/metrics.md lists both).",
            )
    return out


def flatten_yaml(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``{web: {listen-address: x}}`` and ``{web.listen-address: x}`` both give ``web.listen-address``.

    ``collector: {efa: {enabled: false}}`` maps to ``collector.efa``.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config file'}: expected a mapping, got {type(data).__name__}")
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            yield from flatten_yaml(value, full)
        elif full.endswith(".enabled") and full.startswith("collector."):
            yield full.removesuffix(".enabled"), value
        else:
            yield full, value


MAX_FILE_BYTES = 1 << 20  # a config file or a token file; anything larger is not one


def read_regular_file(path: str, what: str) -> bytes:
    """A small regular file's bytes, without blocking: a FIFO, a device or a directory is refused at once
    (``check --timeout 3`` with a FIFO as ``--config`` once hung until it was killed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{what}: {path} is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{what}: {path} is larger than {MAX_FILE_BYTES >> 20} MiB")
        chunks = []
        size = 0
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_FILE_BYTES:
                raise ConfigError(f"{what}: {path} is larger than {MAX_FILE_BYTES >> 20} MiB")
        return b"".join(chunks)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _yaml_loader(path: str) -> type:
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge (<<) supplies defaults that the mapping's own keys override
            key = loader.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # an unhashable key: construct_mapping names it
            if duplicate:
                raise ConfigError(f"--config: {path}: line {key_node.start_mark.line + 1}: {key!r} given twice")
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return UniqueKeyLoader


def read_yaml(path: str) -> dict[str, Any]:
    import yaml  # lazy: only needed with --config

    raw = read_regular_file(path, "--config")
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_yaml_loader(path))
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise ConfigError(f"--config: {path} is not UTF-8 (byte 0x{byte:02x} at offset {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config: {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    out: dict[str, Any] = {}
    for key, value in flatten_yaml(data):
        if key in out:  # `web.listen-address:` and `web: {listen-address:}` in one file
            raise ConfigError(f"--config: {path}: {key!r} given twice")
        out[key] = value
    return out


# Settings where an empty value from the environment or a flag means "not given": an empty
# FLEETSCOPE_PUSH_TOKEN (a variable a template left blank) must not turn off the YAML file's token.
EMPTY_IS_UNSET = frozenset({"push.token", "push.token-file"})


def _resolve_token(values: dict[str, Any]) -> None:
    """push.token-file read into push.token; both at once is a mistake, not a precedence."""
    path = values.pop("push.token-file", "")
    if not path:
        return
    if values.get("push.token"):
        raise ConfigError("push.token and push.token-file both given: give one, not both")
    try:
        token = parse_token(read_regular_file(path, "push.token-file").decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"push.token-file: {path} is not UTF-8 text") from None
    if not token:
        raise ConfigError(f"push.token-file: {path} is empty: a token file without a token would turn auth off")
    values["push.token"] = token
    values["push.token-file"] = path


def load(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    yaml_path: str | None = None,
    registry: Mapping[str, CollectorEntry] = REGISTRY,
) -> Config:
    """Merge flags > environment > YAML > defaults into a validated :class:`Config`.

    ``flags`` maps dotted keys to raw values, holding only the flags actually given.
    """
    table = settings_table(registry)
    environ = os.environ if environ is None else environ
    raw: dict[str, tuple[Any, str]] = {}
    if yaml_path:
        for key, value in read_yaml(yaml_path).items():
            if key not in table:
                raise ConfigError(f"{yaml_path}: unknown setting {key!r}")
            raw[key] = (value, f"{yaml_path}: {key}")
    known_env = {info.env: key for key, info in table.items()}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in CLIENT_ENV:
            continue
        if name not in known_env:
            raise ConfigError(f"environment: unknown setting {name}")
        if known_env[name] in EMPTY_IS_UNSET and not str(value).strip():
            continue
        raw[known_env[name]] = (value, f"environment {name}")
    for key, value in (flags or {}).items():
        if key not in table:
            raise ConfigError(f"unknown flag --{key}")
        if key in EMPTY_IS_UNSET and not str(value).strip():
            continue
        raw[key] = (value, f"--{key}")

    values: dict[str, Any] = {}
    for key, (value, origin) in raw.items():
        try:
            values[key] = table[key].parse(value)
        except ValueError as exc:
            raise ConfigError(f"{origin}: {exc}") from None
    _resolve_token(values)

    sections: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.metadata["key"] in values:
                kwargs[f.name] = values[f.metadata["key"]]
        sections[section] = cls(**kwargs)
    collectors = {}
    for name, entry in registry.items():
        settings = CollectorSettings(
            enabled=values.get(f"collector.{name}", entry.default_enabled),
            interval=values.get(f"collector.{name}.interval", entry.default_interval),
            timeout=values.get(f"collector.{name}.timeout", entry.default_timeout),
            detail=values.get(f"collector.{name}.detail", "default"),
        )
        if settings.timeout > settings.interval * 10:
            raise ConfigError(f"collector.{name}.timeout: {settings.timeout}s is more than 10x its interval")
        collectors[name] = settings
    return Config(**sections, collectors=collectors)
