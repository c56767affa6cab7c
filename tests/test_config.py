from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import pytest

from fleetscope.config import ConfigError, load, settings_table


def write(tmp_path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_follow_node_exporter_conventions():
    config = load({}, environ={})
    assert config.web.listen_address == ":9402"
    assert config.web.telemetry_path == "/metrics"
    assert config.path.sysfs == "/sys" and config.path.procfs == "/proc"
    assert config.collector("gpu").enabled


def test_flag_beats_environment_beats_yaml(tmp_path):
    yaml_path = write(tmp_path, "web:\n  listen-address: ':1111'\npath:\n  sysfs: /yaml/sys\n  procfs: /yaml/proc\n")
    environ = {"FLEETSCOPE_WEB_LISTEN_ADDRESS": ":2222", "FLEETSCOPE_PATH_SYSFS": "/env/sys"}
    config = load({"web.listen-address": "127.0.0.1:3333"}, environ=environ, yaml_path=yaml_path)
    assert config.web.listen_address == "127.0.0.1:3333"
    assert config.path.sysfs == "/env/sys"
    assert config.path.procfs == "/yaml/proc"


def test_collector_switches_from_every_source(tmp_path):
    yaml_path = write(tmp_path, "collector:\n  efa:\n    enabled: false\n    interval: 30s\n  netdev: false\n")
    config = load({"collector.gpu": False}, environ={"FLEETSCOPE_COLLECTOR_ENA": "no"}, yaml_path=yaml_path)
    assert not config.collector("efa").enabled and config.collector("efa").interval == 30
    assert not config.collector("netdev").enabled
    assert not config.collector("gpu").enabled
    assert not config.collector("ena").enabled
    assert config.collector("netstat").enabled


def test_dotted_yaml_keys_work(tmp_path):
    config = load({}, environ={}, yaml_path=write(tmp_path, "gpu.expected-count: 8\n"))
    assert config.gpu.expected_count == 8


@pytest.mark.parametrize(
    ("flags", "environ", "yaml_text", "message"),
    [
        ({}, {}, "web:\n  listen-adress: ':1'\n", "web.listen-adress"),
        ({}, {"FLEETSCOPE_WEB_LISTEN": ":1"}, None, "FLEETSCOPE_WEB_LISTEN"),
        ({"collector.efa.interval": "soon"}, {}, None, "--collector.efa.interval"),
        ({}, {"FLEETSCOPE_GPU_EXPECTED_COUNT": "-1"}, None, "FLEETSCOPE_GPU_EXPECTED_COUNT"),
        ({}, {}, "net:\n  device-include: '(['\n", "net.device-include"),
        ({"web.listen-address": "localhost"}, {}, None, "--web.listen-address"),
        ({}, {}, "collector:\n  efa:\n    enabled: maybe\n", "collector.efa"),
    ],
)
def test_unknown_keys_and_bad_values_name_the_key(tmp_path, flags, environ, yaml_text, message):
    yaml_path = write(tmp_path, yaml_text) if yaml_text else None
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(").replace("[", r"\[")):
        load(flags, environ=environ, yaml_path=yaml_path)


def test_unreadable_yaml_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load({}, environ={}, yaml_path=write(tmp_path, "web: [unclosed\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load({}, environ={}, yaml_path=str(tmp_path / "missing.yaml"))


def test_every_setting_has_help_and_an_env_name():
    for key, info in settings_table().items():
        assert info.help, key
        assert info.env.startswith("FLEETSCOPE_") and info.env.isupper()


def test_staleness_defaults_to_three_intervals_plus_timeout():
    config = load({"collector.efa.interval": "10", "collector.efa.timeout": "5"}, environ={})
    assert config.staleness_for("efa") == 35
    assert load({"collection.staleness": "2m"}, environ={}).staleness_for("efa") == 120


def test_detail_level_per_collector_from_every_source(tmp_path):
    assert load({}, environ={}).collector("efa").detail == "default"
    yaml_path = write(tmp_path, "collector:\n  efa:\n    detail: all\n")
    assert load({}, environ={}, yaml_path=yaml_path).collector("efa").detail == "all"
    config = load({"collector.gpu.detail": "ALL"}, environ={"FLEETSCOPE_COLLECTOR_EFA_DETAIL": "default"},
                  yaml_path=yaml_path)
    assert (config.collector("gpu").detail, config.collector("efa").detail) == ("all", "default")
    with pytest.raises(ConfigError, match=r"--collector\.efa\.detail: expected one of default, all"):
        load({"collector.efa.detail": "some"}, environ={})


def test_detail_level_only_where_a_collector_has_levels():
    from fleetscope.collectors import REGISTRY
    from fleetscope.metrics import ALL_TABLES

    with_levels = {t.collector for t in ALL_TABLES for spec in t if spec.at_default is not None}
    assert with_levels == {name for name, entry in REGISTRY.items() if entry.detail_levels} == {"efa", "gpu"}
    assert {key for key in settings_table() if key.endswith(".detail")} == {
        "collector.efa.detail", "collector.gpu.detail"}
    with pytest.raises(ConfigError, match=r"unknown flag --collector\.netstat\.detail"):
        load({"collector.netstat.detail": "all"}, environ={})


# -- tokens and config files (#30 item 6) ---------------------------------------------------------------


def test_the_push_token_is_trimmed_like_the_token_a_client_sends(tmp_path):
    assert load({"push.token": "s3cret\n"}, environ={}).push.token == "s3cret"
    token = tmp_path / "token"
    token.write_text("  s3cret\r\n")
    assert load({"push.token-file": str(token)}, environ={}).push.token == "s3cret"


def test_an_empty_token_variable_does_not_turn_auth_off(tmp_path):
    """Measured before: FLEETSCOPE_PUSH_TOKEN="" overrode the YAML token, and every push was accepted."""
    yaml_path = write(tmp_path, "push:\n  token: from-yaml\n")
    for empty in ("", "  ", "\n"):
        assert load({}, environ={"FLEETSCOPE_PUSH_TOKEN": empty}, yaml_path=yaml_path).push.token == "from-yaml"
        assert load({"push.token": empty}, environ={}, yaml_path=yaml_path).push.token == "from-yaml"
    assert load({}, environ={"FLEETSCOPE_PUSH_TOKEN": ""}).push.token == ""


def test_a_token_file_must_hold_a_token(tmp_path):
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"push\.token-file.*empty"):
        load({"push.token-file": str(tmp_path / "empty")}, environ={})
    with pytest.raises(ConfigError, match=r"push\.token-file.*cannot read"):
        load({"push.token-file": str(tmp_path / "missing")}, environ={})
    (tmp_path / "token").write_text("a\n")
    with pytest.raises(ConfigError, match="not both"):
        load({"push.token-file": str(tmp_path / "token")}, environ={"FLEETSCOPE_PUSH_TOKEN": "b"})


def test_duplicate_yaml_keys_are_refused(tmp_path):
    """Measured before: the second value silently won."""
    for text in ("push:\n  token: a\n  token: b\n", "web:\n  listen-address: ':1'\nweb:\n  read-timeout: 5s\n",
                 "web.listen-address: ':1'\nweb:\n  listen-address: ':2'\n"):
        with pytest.raises(ConfigError, match="given twice"):
            load({}, environ={}, yaml_path=write(tmp_path, text))


def load_within(seconds: float, **kwargs):
    """load() on a thread: a config read that blocks must not hang the test."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(load(**kwargs))
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, f"load() still blocked after {seconds} s"
    return outcome[0]


def test_a_config_that_is_no_regular_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    (tmp_path / "dir.yaml").mkdir()
    for path in (fifo, tmp_path / "dir.yaml"):
        error = load_within(120, flags={}, environ={}, yaml_path=str(path))
        assert isinstance(error, ConfigError) and "not a regular file" in str(error), error
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_check_with_a_fifo_config_answers_could_not_tell_within_its_timeout(tmp_path):
    """Measured before: `check --timeout 3` with a FIFO as --config hung until it was killed."""
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "exporter")
    # The answer is the claim: opening a FIFO nobody writes to blocks forever, so a check that answers (the
    # refusal names the file type) never opened it. The subprocess deadline only guards a hang; it is no verdict
    # on speed (an interpreter's start on a loaded machine takes what it takes).
    done = subprocess.run([sys.executable, "-m", "fleetscope", "check", "--config", str(fifo), "--timeout", "3",
                           "--no-collector.gpu", "--no-collector.ena"], capture_output=True, text=True,
                          timeout=240, env=env, check=False)
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr


def test_every_variable_the_client_reads_or_sets_is_a_setting_or_left_to_the_client() -> None:
    """The client's own FLEETSCOPE_* variables never make the daemon's commands refuse to start (#35 item 9)."""
    import pathlib
    import re

    import fleetscope.client
    from fleetscope.config import CLIENT_ENV
    client = pathlib.Path(fleetscope.client.__file__).parent
    used = {name for path in client.glob("*.py") for name in re.findall(r"FLEETSCOPE_[A-Z_]+", path.read_text())}
    settings = {info.env for info in settings_table().values()}
    assert "FLEETSCOPE_RANK_PROCESS" in used
    assert used - settings <= CLIENT_ENV, used - settings - CLIENT_ENV
    load(environ=dict.fromkeys(CLIENT_ENV, "1:0:job"))  # no "unknown setting"


def test_the_median_window_has_an_upper_bound() -> None:
    assert load(flags={"push.median-window": "1024"}, environ={}).push.median_window == 1024
    with pytest.raises(ConfigError, match=r"push\.median-window"):
        load(flags={"push.median-window": str(10**9)}, environ={})
