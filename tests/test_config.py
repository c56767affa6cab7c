from __future__ import annotations

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
