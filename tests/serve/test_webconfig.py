"""``--web.config.file``: TLS, mTLS and basic auth on the daemon's listeners (#35 item 10).

The daemon runs for real (``fleetscope serve`` through the harness, port 0), clients are httpx over real
TLS with certificates from trustme; the live test at the end has a real Prometheus scrape it.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
import trustme

from fleetscope.config import ConfigError
from fleetscope.serve.webconfig import WebConfig, parse
from fleetscope_sim.harness import Daemon, Prometheus, eventually

PASSWORD = "s3cret pass"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()  # low cost: a test, not a secret
NO_HARDWARE = {"collector.gpu": False, "collector.efa": False, "collector.ena": False, "collector.nccl": False}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("prometheus@example")
    paths = {"ca": base / "ca.pem", "cert": base / "server.pem", "key": base / "server.key",
             "client": base / "client.pem", "client_key": base / "client.key"}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    server.private_key_pem.write_to_path(paths["key"])
    client.cert_chain_pems[0].write_to_path(paths["client"])
    client.private_key_pem.write_to_path(paths["client_key"])
    return {"ca": ca, "server": server, **{k: str(v) for k, v in paths.items()}}


def write_web_config(path: Path, tls: dict[str, str] | None = None, users: dict[str, str] | None = None) -> str:
    data: dict[str, Any] = {}
    if tls is not None:
        data["tls_server_config"] = tls
    if users is not None:
        data["basic_auth_users"] = users
    path.write_text(json.dumps(data))  # JSON is YAML
    return str(path)


# -- the file: what it may say ----------------------------------------------------------------------


@pytest.mark.parametrize("content, message", [
    ({"tls_server_config": {"cert_file": "a"}}, "needs cert_file and key_file"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "cipher_suites": []}}, "unsupported: cipher_suites"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "Maybe"}},
     "client_auth_type 'Maybe'"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAnyClientCert"}},
     "needs client_ca_file"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS10"}}, "expected TLS12 or TLS13"),
    ({"basic_auth_users": {"prometheus": "plain text"}}, "not a bcrypt hash"),
    ({"http_server_config": {"http2": True}}, "unsupported key(s) http_server_config"),
])
def test_what_the_file_cannot_say_is_one_line(tmp_path, content, message) -> None:
    path = tmp_path / "web.yml"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(str(path))


def test_tls_files_that_do_not_load_stop_the_start(tmp_path) -> None:
    path = write_web_config(tmp_path / "web.yml", {"cert_file": str(tmp_path / "none.pem"), "key_file": "k"})
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        WebConfig(path)


def test_a_ca_given_means_client_certificates_are_required_and_verified(tmp_path, pki) -> None:
    path = write_web_config(tmp_path / "web.yml", {"cert_file": pki["cert"], "key_file": pki["key"],
                                                  "client_ca_file": pki["ca"]})
    settings = parse(path)
    assert settings.tls is not None and settings.tls.client_auth_type == "RequireAndVerifyClientCert"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_auth_checks_bcrypt_and_leaves_the_probes_open(tmp_path) -> None:
    web = WebConfig(write_web_config(tmp_path / "web.yml", users={"prometheus": HASH}))
    good = basic("prometheus", PASSWORD)
    assert web.authorized(good) and web.authorized(good)  # the second from the cache of accepted headers
    assert not web.authorized(basic("prometheus", "wrong"))
    assert not web.authorized(basic("nobody", PASSWORD))
    assert not web.authorized(None) and not web.authorized("Basic !!!") and not web.authorized("Bearer x")
    assert web.needs_auth("/metrics") and web.needs_auth("/api/v1/steps")
    assert not web.needs_auth("/healthz") and not web.needs_auth("/readyz")


# -- the daemon serving it ------------------------------------------------------------------------------


def start_daemon(tmp_path: Path, web_config: str, **settings: Any) -> Daemon:
    daemon = Daemon.serve(tmp_path, {**NO_HARDWARE, "web.config.file": web_config, **settings})
    daemon.spawn()
    return wait_bound(daemon)


def wait_bound(daemon: Daemon) -> Daemon:
    """``daemon`` once it has written its ready file (the addresses it bound); 60 s guard only a hang reaches."""
    daemon.addresses = eventually(lambda: daemon.check_running() or _bound(daemon), 60, "the daemon's ready file")
    return daemon


def _bound(daemon: Daemon) -> dict[str, str] | None:
    try:
        return dict(json.loads(daemon.ready_file.read_text()))
    except FileNotFoundError:
        return None


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.stop()


def test_tls_and_basic_auth_on_every_listener(tmp_path, pki, daemons) -> None:
    web = write_web_config(tmp_path / "web.yml", {"cert_file": pki["cert"], "key_file": pki["key"]},
                           {"prometheus": HASH})
    daemon = start_daemon(tmp_path, web, **{"push.listen-address": "127.0.0.1:0"})
    daemons.append(daemon)
    verify = ssl.create_default_context(cafile=pki["ca"])
    for listener, probe in (("main", "/readyz"), ("push", "/healthz")):
        base = f"https://{daemon.addresses[listener]}"
        path = "/metrics" if listener == "main" else "/api/v1/steps"
        assert httpx.get(base + probe, verify=verify).status_code in (200, 503)  # probes need no password
        assert httpx.get(base + path, verify=verify).status_code == 401
        assert httpx.get(base + path, verify=verify, auth=("prometheus", "wrong")).status_code == 401
        answer = httpx.get(base + path, verify=verify, auth=("prometheus", PASSWORD))
        assert answer.status_code == (200 if listener == "main" else 405), answer.text
        with pytest.raises(httpx.HTTPError):  # plain HTTP on a TLS listener: no answer
            httpx.get(f"http://{daemon.addresses[listener]}{probe}", timeout=5)


def test_a_rotated_certificate_serves_the_next_connection_without_a_restart(tmp_path, pki, daemons) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    pki["server"].cert_chain_pems[0].write_to_path(cert)
    pki["server"].private_key_pem.write_to_path(key)
    daemon = start_daemon(tmp_path, write_web_config(tmp_path / "web.yml", {"cert_file": str(cert),
                                                                             "key_file": str(key)}))
    daemons.append(daemon)
    url = f"https://{daemon.address}/healthz"
    assert httpx.get(url, verify=ssl.create_default_context(cafile=pki["ca"])).status_code == 200
    new_ca = trustme.CA()
    issued = new_ca.issue_cert("127.0.0.1")
    issued.private_key_pem.write_to_path(key)
    issued.cert_chain_pems[0].write_to_path(cert)
    trusting_new = ssl.create_default_context()
    new_ca.configure_trust(trusting_new)

    def served_by_the_new_certificate() -> bool:
        try:
            return httpx.get(url, verify=trusting_new).status_code == 200
        except httpx.ConnectError:
            return False

    eventually(served_by_the_new_certificate, 30, "the rotated certificate to be served")


# -- a real Prometheus scraping it ----------------------------------------------------------------------


@pytest.mark.live
def test_prometheus_scrapes_over_https_with_basic_auth_and_with_mtls(tmp_path, pki, daemons) -> None:
    """One Prometheus, two daemons: one behind TLS and basic auth, one requiring a client certificate."""
    tls = {"cert_file": pki["cert"], "key_file": pki["key"]}
    mtls = tls | {"client_ca_file": pki["ca"], "client_auth_type": "RequireAndVerifyClientCert"}
    (tmp_path / "password").write_text(PASSWORD)
    configs = {"basic auth": (tls, {"prometheus": HASH}), "mTLS": (mtls, None)}
    for mode, (server_tls, users) in configs.items():
        workdir = tmp_path / mode.replace(" ", "-")
        workdir.mkdir()
        daemon = Daemon.serve(workdir, {**NO_HARDWARE,
                                        "web.config.file": write_web_config(workdir / "web.yml", server_tls, users)})
        daemon.spawn()  # both start at once; each is waited for below
        daemons.append(daemon)
    basic, mutual = (wait_bound(daemon) for daemon in daemons)
    scrapes: list[dict[str, Any]] = [
        {"job_name": "basic auth", "scheme": "https", "tls_config": {"ca_file": pki["ca"]},
         "basic_auth": {"username": "prometheus", "password_file": str(tmp_path / "password")},
         "static_configs": [{"targets": [basic.address]}]},
        {"job_name": "mTLS", "scheme": "https",
         "tls_config": {"ca_file": pki["ca"], "cert_file": pki["client"], "key_file": pki["client_key"]},
         "static_configs": [{"targets": [mutual.address]}]},
    ]
    prometheus = Prometheus(tmp_path / "prometheus").start({"global": {"scrape_interval": "1s"},
                                                            "scrape_configs": scrapes})
    try:
        both = eventually(lambda: {r["metric"]["job"] for r in prometheus.query("up == 1")} >= set(configs) or None,
                          60, "Prometheus to scrape both daemons")
    finally:
        prometheus.stop()
    assert both
    # Without a client certificate the mTLS daemon's handshake itself is refused.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"https://{mutual.address}/metrics", verify=ssl.create_default_context(cafile=pki["ca"]))


def test_the_flag_the_chart_passes_is_the_daemons() -> None:
    """deploy/helm/fleetscope passes --web.config.file=...: the serve command takes it as this setting."""
    from fleetscope.cli import build_parser, config_from_args

    args = build_parser().parse_args(["serve", "--web.config.file=/etc/fleetscope-web/web-config.yml"])
    assert config_from_args(args).web.config_file == "/etc/fleetscope-web/web-config.yml"
