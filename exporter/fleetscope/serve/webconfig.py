"""TLS and basic auth on the daemon's listeners, from a web config file in the exporter-toolkit format.

``--web.config.file`` takes the file node_exporter, the Pushgateway and dcgm-exporter take::

    tls_server_config:
      cert_file: /etc/fleetscope/tls/server.crt
      key_file: /etc/fleetscope/tls/server.key
      client_ca_file: /etc/fleetscope/tls/ca.crt     # mTLS
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert (default), VerifyClientCertIfGiven, ...
      min_version: TLS12                             # or TLS13
    basic_auth_users:
      prometheus: $2b$12$...                         # bcrypt hashes (htpasswd -nBC 12 prometheus)

It applies to every listener (``/metrics`` and the push API alike). With
``tls_server_config`` a listener speaks TLS only: a plain HTTP request gets no
answer but the failed handshake. With ``basic_auth_users`` every route asks
for a user and password except the two probes, ``/healthz`` and
``/readyz``: they say only that the daemon is up (which a TCP connect tells
anyone who can reach the port), and the kubelet's probes can neither carry a
client certificate nor a password without writing it into the pod spec.
node_exporter authenticates its probes too; it has no readiness to report.

**Reloading.** As exporter-toolkit reads its file for every connection, the
daemon looks at the file and at the certificate, key and CA files it names
(their modification times and sizes) at most once a second, when a TLS
handshake or a request comes. A changed set is read again and, once it loads,
serves the next connections: a rotated certificate needs no restart. A file
that no longer loads (a half-written key) keeps the previous configuration
and is logged. The listener's ``SSLContext`` stays the one uvicorn was given;
its server-name callback hands each handshake the newest context (certificate,
key and client CA), and the few settings OpenSSL takes from the listener's
own context when a connection starts (client certificate mode, minimum
version) are set on it at the reload.

bcrypt is the ``bcrypt`` package (a dependency), imported only with ``basic_auth_users``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fleetscope.config import ConfigError, read_regular_file

logger = logging.getLogger(__name__)

CLIENT_AUTH_TYPES: dict[str, ssl.VerifyMode] = {
    "NoClientCert": ssl.CERT_NONE,
    # Python's ssl verifies any certificate it asks for: the two modes that ask without verifying in Go are
    # taken to verify against client_ca_file, which they then need.
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/readyz"})
RELOAD_CHECK_SECONDS = 1.0


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_ca_file: str = ""
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = ""


@dataclass(frozen=True)
class WebSettings:
    """What one reading of the web config file says."""

    tls: TlsSettings | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash

    def files(self) -> list[str]:
        if self.tls is None:
            return []
        return [f for f in (self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file) if f]


def parse(path: str) -> WebSettings:
    """The web config file at ``path``, checked the way exporter-toolkit checks it (unknown keys refused)."""
    import yaml

    try:
        data = yaml.safe_load(read_regular_file(path, "web.config.file").decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"web.config.file: {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"web.config.file: {path} is not valid YAML: {exc}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"web.config.file: {path}: expected a mapping")
    unknown = set(data) - {"tls_server_config", "basic_auth_users"}
    if unknown:
        raise ConfigError(f"web.config.file: {path}: unsupported key(s) {', '.join(sorted(map(str, unknown)))} "
                          "(fleetscope reads tls_server_config and basic_auth_users)")
    base = os.path.dirname(os.path.abspath(path))
    return WebSettings(_tls(data.get("tls_server_config"), path, base), _users(data.get("basic_auth_users"), path))


def _tls(raw: Any, path: str, base: str) -> TlsSettings | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - TLS_KEYS:
        extra = sorted(map(str, set(raw) - TLS_KEYS)) if isinstance(raw, dict) else []
        raise ConfigError(f"web.config.file: {path}: tls_server_config: expected a mapping of "
                          f"{', '.join(sorted(TLS_KEYS))}" + (f"; unsupported: {', '.join(extra)}" if extra else ""))
    values = {k: "" if v is None else str(v) for k, v in raw.items()}

    def resolve(name: str) -> str:  # relative paths are relative to the file, as exporter-toolkit reads them
        value = values.get(name, "")
        return os.path.join(base, value) if value and not os.path.isabs(value) else value

    if not values.get("cert_file") or not values.get("key_file"):
        raise ConfigError(f"web.config.file: {path}: tls_server_config needs cert_file and key_file")
    ca = resolve("client_ca_file")
    auth = values.get("client_auth_type") or ("RequireAndVerifyClientCert" if ca else "NoClientCert")
    if auth not in CLIENT_AUTH_TYPES:
        raise ConfigError(f"web.config.file: {path}: client_auth_type {auth!r}: expected one of "
                          f"{', '.join(CLIENT_AUTH_TYPES)}")
    if auth != "NoClientCert" and not ca:
        raise ConfigError(f"web.config.file: {path}: client_auth_type {auth} needs client_ca_file (Python's TLS "
                          "verifies every client certificate it asks for)")
    for key in ("min_version", "max_version"):
        if values.get(key) and values[key] not in TLS_VERSIONS:
            raise ConfigError(f"web.config.file: {path}: {key} {values[key]!r}: expected TLS12 or TLS13")
    return TlsSettings(resolve("cert_file"), resolve("key_file"), ca, auth, values.get("min_version") or "TLS12",
                       values.get("max_version", ""))


def _users(raw: Any, path: str) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"web.config.file: {path}: basic_auth_users: expected a mapping of user to bcrypt hash")
    users = {}
    for user, hashed in raw.items():
        text = "" if hashed is None else str(hashed)
        if not text.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"web.config.file: {path}: basic_auth_users: {user}: not a bcrypt hash")
        users[str(user)] = text.encode()
    if users:
        _bcrypt()  # refuse at start, in one line, rather than at the first request
    return users


def _bcrypt() -> Any:
    try:
        import bcrypt
    except ImportError:
        raise ConfigError("web.config.file: basic_auth_users needs the bcrypt package (a dependency of "
                          "fleetscope): pip install bcrypt") from None
    return bcrypt


def build_context(tls: TlsSettings) -> ssl.SSLContext:
    """A server ``SSLContext`` for ``tls``; any file that does not load is a :class:`ConfigError`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_alpn_protocols(["http/1.1"])
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    if tls.max_version:
        context.maximum_version = TLS_VERSIONS[tls.max_version]
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file:
            context.load_verify_locations(cafile=tls.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"web.config.file: cannot load the TLS files: {exc}") from None
    context.verify_mode = CLIENT_AUTH_TYPES[tls.client_auth_type]
    return context


def _stamp(paths: list[str]) -> tuple[tuple[float, int], ...]:
    out = []
    for path in paths:
        try:
            info = os.stat(path)
            out.append((info.st_mtime, info.st_size))
        except OSError:
            out.append((-1.0, -1))
    return tuple(out)


class WebConfig:
    """The web config file as it is now: settings, the TLS context, and basic auth; reloaded when it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.settings = parse(path)
        self._context = build_context(self.settings.tls) if self.settings.tls else None
        self._stamp = _stamp([path, *self.settings.files()])
        self._checked = time.monotonic()
        self._listeners: list[ssl.SSLContext] = []
        # sha256 of (hash, header) that passed bcrypt -> when: exporter-toolkit caches accepted ones too
        self._accepted: dict[bytes, float] = {}

    @property
    def tls(self) -> bool:
        return self.settings.tls is not None

    def listener_context(self) -> ssl.SSLContext | None:
        """The context for one listener: each handshake is handed the newest context by its SNI callback."""
        if self._context is None:
            return None
        context = build_context(self.settings.tls) if self.settings.tls else None
        assert context is not None
        context.sni_callback = self._handshake
        self._listeners.append(context)
        return context

    def _handshake(self, connection: Any, server_name: str | None, listener: ssl.SSLContext) -> None:
        self.maybe_reload()
        current = self._context
        if current is not None and current is not listener:
            connection.context = current

    def maybe_reload(self) -> None:
        """Read the files again if they changed (looked at no more than once a second)."""
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_SECONDS:
            return
        with self._lock:
            self._checked = now
            stamp = _stamp([self.path, *self.settings.files()])
            if stamp == self._stamp:
                return
            try:
                settings = parse(self.path)
                context = build_context(settings.tls) if settings.tls else None
            except ConfigError as exc:
                logger.error("%s; keeping the configuration loaded before", exc)
                self._stamp = stamp  # once per change, not every second
                return
            if (settings.tls is None) != (self.settings.tls is None):
                logger.error("web.config.file: %s turns TLS %s: that takes a restart; keeping the configuration "
                             "loaded before", self.path, "on" if settings.tls else "off")
                self._stamp = stamp
                return
            self.settings, self._context = settings, context
            self._stamp = _stamp([self.path, *settings.files()])
            self._accepted.clear()
            for listener in self._listeners:
                if context is not None:
                    listener.verify_mode = context.verify_mode
                    listener.minimum_version = context.minimum_version
            logger.info("web.config.file: %s reloaded", self.path)

    # -- basic auth -------------------------------------------------------------------------------

    def needs_auth(self, path: str) -> bool:
        return bool(self.settings.users) and path not in UNAUTHENTICATED_PATHS

    def authorized(self, header: str | None) -> bool:
        """Whether ``Authorization: Basic ...`` names a user of the file with the right password (bcrypt)."""
        users = self.settings.users
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep or user not in users:
            return False
        key = hashlib.sha256(users[user] + b"\0" + header.encode()).digest()
        if key in self._accepted:
            return True
        ok = bool(_bcrypt().checkpw(password.encode(), users[user]))
        if ok:
            if len(self._accepted) > 256:
                self._accepted.clear()
            self._accepted[key] = time.monotonic()
        return ok


class BasicAuth:
    """ASGI middleware: 401 with ``WWW-Authenticate`` unless the request carries a user of the web config file.

    The bcrypt check runs on a worker thread: it takes tens of milliseconds on purpose, and the event loop
    serves every other connection meanwhile.
    """

    def __init__(self, app: Any, web: WebConfig) -> None:
        self.app = app
        self.web = web

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.web.maybe_reload()
        if self.web.needs_auth(scope["path"]):
            from anyio import to_thread

            header = None
            for name, value in scope.get("headers", []):
                if name == b"authorization":
                    header = value.decode("latin-1")
            if not await to_thread.run_sync(self.web.authorized, header):
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"www-authenticate", b'Basic realm="fleetscope"')]})
                await send({"type": "http.response.body", "body": b"Unauthorized\n"})
                return
        await self.app(scope, receive, send)

