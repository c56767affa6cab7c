"""One log setup for every command: logfmt or JSON lines on stderr, libraries' records included."""

from __future__ import annotations

import io
import json
import logging
import pathlib
import re
from collections.abc import Iterator

import pytest

from fleetscope.config import LogConfig, load
from fleetscope.logs import setup_logging
from tests.conftest import ROOT


@pytest.fixture
def restore_root() -> Iterator[None]:
    """Put back every logger's handlers, propagation and level as they were."""
    loggers = [logging.getLogger(), *(x for x in logging.Logger.manager.loggerDict.values()
                                      if isinstance(x, logging.Logger))]
    saved = [(x, x.handlers[:], x.propagate, x.level) for x in loggers]
    yield
    for x, handlers, propagate, level in saved:
        x.handlers[:] = handlers
        x.propagate = propagate
        x.setLevel(level)


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


@pytest.mark.usefixtures("restore_root")
def test_logfmt_lines_carry_time_level_logger_message_and_extra_fields() -> None:
    out = io.StringIO()
    setup_logging(LogConfig(level="info", format="logfmt"), out)
    log = logging.getLogger("fleetscope.serve.engine")
    log.info("collector %s timed out after %.1fs", "gpu", 8.0)
    log.debug("not shown at info")
    log.warning('a "quoted" value', extra={"collector": "efa"})
    first, second = lines(out)
    assert re.fullmatch(
        r'time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z level=info logger=fleetscope\.serve\.engine '
        r'msg="collector gpu timed out after 8\.0s"', first)
    assert second.endswith(r'level=warning logger=fleetscope.serve.engine msg="a \"quoted\" value" collector=efa')


@pytest.mark.usefixtures("restore_root")
def test_json_lines_parse_and_keep_exceptions() -> None:
    out = io.StringIO()
    setup_logging(LogConfig(level="debug", format="json"), out)
    try:
        raise RuntimeError("driver gone")
    except RuntimeError:
        logging.getLogger("fleetscope.sources.nvml").exception("NVML failed")
    (line,) = lines(out)
    record = json.loads(line)
    assert list(record)[:4] == ["time", "level", "logger", "msg"]
    assert (record["level"], record["logger"], record["msg"]) == ("error", "fleetscope.sources.nvml", "NVML failed")
    assert "RuntimeError: driver gone" in record["exception"]


@pytest.mark.usefixtures("restore_root")
def test_library_records_take_the_same_path_and_setup_replaces_not_stacks() -> None:
    uvicorn = logging.getLogger("uvicorn.error")
    uvicorn.addHandler(logging.StreamHandler(io.StringIO()))  # as uvicorn's own logging setup does
    uvicorn.propagate = False
    setup_logging(LogConfig(level="info"), io.StringIO())
    out = io.StringIO()
    setup_logging(LogConfig(level="info"), out)
    assert len(logging.getLogger().handlers) == 1
    logging.getLogger("uvicorn.error").info("Uvicorn running", extra={"color_message": "\x1b[1mUvicorn\x1b[0m running"})
    (line,) = lines(out)
    assert line.endswith('level=info logger=uvicorn.error msg="Uvicorn running"')  # no terminal colours


def test_format_and_level_are_settings_of_the_one_config() -> None:
    config = load({"log.format": "JSON", "log.level": "debug"}, environ={})
    assert (config.log.format, config.log.level) == ("json", "debug")
    assert load({}, environ={"FLEETSCOPE_LOG_FORMAT": "logfmt"}).log.format == "logfmt"
    with pytest.raises(ValueError, match="logfmt, json"):
        load({"log.format": "text"}, environ={})


def test_only_the_logs_module_sets_up_handlers() -> None:
    """No basicConfig or handler wiring deep inside modules: commands call fleetscope.logs.setup_logging."""
    offenders = []
    for path in sorted(pathlib.Path(ROOT).glob("*/**/*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if not relative.startswith(("exporter/", "sim/", "benchmarks/")) or relative == "exporter/fleetscope/logs.py":
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"\bbasicConfig\(|\.addHandler\(", text):
            offenders.append(relative)
    assert offenders == []


def test_every_module_logs_under_its_own_name() -> None:
    """getLogger(__name__), never a name typed by hand: a record says which module wrote it, and a level set on a
    package ("fleetscope.client", "fleetscope_sim") reaches every module below it."""
    calls = 0
    offenders = []
    for package in ("exporter/fleetscope", "sim/fleetscope_sim"):
        for path in sorted((pathlib.Path(ROOT) / package).rglob("*.py")):
            for argument in re.findall(r"\bgetLogger\(([^)]*)\)", path.read_text(encoding="utf-8")):
                calls += 1
                if argument != "__name__" and path.name != "logs.py":  # logs.py sets up the root logger
                    offenders.append(f"{path.relative_to(ROOT)}: getLogger({argument})")
    assert calls > 20 and offenders == []


@pytest.mark.usefixtures("restore_root")
def test_one_shot_commands_keep_stderr_quiet_unless_asked_for_more() -> None:
    out = io.StringIO()
    setup_logging(LogConfig(level="info"), out, quiet=True)
    logging.getLogger("fleetscope.check.run").info("not shown by default")
    logging.getLogger("fleetscope.check.run").warning("shown")
    assert [line.rsplit("msg=", 1)[1] for line in lines(out)] == ["shown"]
    setup_logging(LogConfig(level="debug"), out, quiet=True)
    logging.getLogger("fleetscope.check.run").debug("asked for")
    assert lines(out)[-1].endswith('msg="asked for"')
