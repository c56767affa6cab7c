"""``fleetscope check``: ask the collectors, and Prometheus where configured, for this node's health findings.

The whole check answers within its timeout, whatever a source does: every
collector's ``health()`` runs on its own daemon thread at once, while this
thread asks Prometheus for the cross-node findings (:mod:`fleetscope.check.prometheus`);
a collector that has not answered by the deadline is reported as "could not
tell", and its thread (stuck in a driver call, holding the source's lock) is
abandoned rather than waited for, closing included.

``--condition gpu|efa|training`` reports one node condition
(:mod:`fleetscope.check.verdicts`) in node-problem-detector's plugin protocol: exit
0, 1 or 2 and one line of at most 80 characters saying why. ``--write DIR``
reports all three as verdict files, once or every ``--every`` seconds, for a
node-problem-detector that cannot run fleetscope itself (docs/deploy.md).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping

from fleetscope.check.verdicts import CONDITIONS, Condition
from fleetscope.collectors import REGISTRY
from fleetscope.collectors.protocol import Closeable, Collector, Finding, HealthCheck, collector_class, one_line
from fleetscope.config import Config
from fleetscope.errors import NoHardware

logger = logging.getLogger(__name__)

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNKNOWN = 2  # could not tell

CLOSE_GRACE = 2.0  # seconds closing the collectors that answered may add after the deadline
MESSAGE_LIMIT = 80  # node-problem-detector keeps this many bytes of a plugin's output as the condition message



def verdict(findings: list[Finding]) -> int:
    """The exit code for these findings: any unhealthy one wins, then any unknown one."""
    if any(f.severity == "unhealthy" for f in findings):
        return EXIT_UNHEALTHY
    if any(f.severity == "unknown" for f in findings):
        return EXIT_UNKNOWN
    return EXIT_HEALTHY

class _HealthCall:
    """One collector's ``health()`` on a daemon thread."""

    def __init__(self, name: str, collector: HealthCheck) -> None:
        self.name = name
        self.findings: list[Finding] = []
        self.error: Exception | None = None
        self.started = time.monotonic()
        self._collector = collector
        self._thread = threading.Thread(target=self._run, name=f"check-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.findings = list(self._collector.health())
        except NoHardware:
            self.findings = []
        except Exception as exc:
            self.error = exc

    def wait(self, deadline: float) -> bool:
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def result(self) -> list[Finding]:
        if self.error is not None:
            return [Finding(self.name, "unknown", "collector",
                            f"could not read: {type(self.error).__name__}: {self.error}")]
        return self.findings


class Checker:
    """The collectors a check asks, built once; each round asks every one of them within one deadline.

    A collector still inside ``health()`` from an earlier round (a driver call that never returns) is not
    asked again until it does: it counts as "could not tell" meanwhile, and no thread piles up behind it.
    """

    def __init__(self, collectors: Mapping[str, Collector]) -> None:
        self.collectors = dict(collectors)
        self._calls: dict[str, _HealthCall] = {}
        self._fresh: set[str] = set()

    def start(self) -> None:
        """Ask every collector that is not still busy with an earlier round."""
        self._fresh = set()
        for name, collector in self.collectors.items():
            if isinstance(collector, HealthCheck) and name not in self._calls:
                self._calls[name] = _HealthCall(name, collector)
                self._fresh.add(name)

    def finish(self, deadline: float, timeout: float) -> list[Finding]:
        """The findings of this round: a collector without an answer by ``deadline`` is "could not tell"."""
        findings: list[Finding] = []
        for name, call in list(self._calls.items()):
            if call.wait(deadline):
                del self._calls[name]
                findings.extend(call.result())
            elif name in self._fresh:
                findings.append(Finding(name, "unknown", "collector", f"no answer within {timeout:g}s"))
            else:
                waited = time.monotonic() - call.started
                findings.append(Finding(name, "unknown", "collector", f"no answer for {waited:.0f}s"))
        return findings

    @property
    def busy(self) -> set[str]:
        return set(self._calls)

    def close(self, wait: float) -> None:
        """Close the collectors not stuck in a call, waiting at most ``wait`` seconds (best effort).

        A collector still inside ``health()`` holds its source's locks: closing it would wait on them.
        """
        closeable = [c for name, c in self.collectors.items() if name not in self._calls and isinstance(c, Closeable)]

        def run() -> None:
            for collector in closeable:
                try:
                    collector.close()
                except Exception as exc:
                    logger.debug("closing %s: %s", type(collector).__name__, exc)

        closer = threading.Thread(target=run, name="check-close", daemon=True)
        closer.start()
        closer.join(wait)


def build_collectors(config: Config, names: Iterable[str] | None = None) -> dict[str, Collector]:
    """The enabled collectors (of ``names``, if given) that have health checks; one that fails to build is logged."""
    wanted = set(config.enabled_collectors() if names is None else names) & set(config.enabled_collectors())
    built: dict[str, Collector] = {}
    for name, entry in REGISTRY.items():
        if name not in wanted:
            continue
        try:
            cls = collector_class(entry)
            if hasattr(cls, "health"):  # only these have anything to say; the rest are not even built
                built[name] = cls(config)
        except Exception as exc:
            logger.error("collector %s could not start: %s", name, exc)
    return built


def run_check(
    config: Config,
    timeout: float = 20.0,
    collectors: Mapping[str, Collector] | None = None,
    condition: Condition | None = None,
    close_grace: float = CLOSE_GRACE,
) -> tuple[list[Finding], int]:
    """Findings and the verdict of the whole node, or of one ``condition``, within ``timeout`` seconds.

    Closing adds at most ``close_grace``. The whole node's check includes the cross-node findings when
    ``check.prometheus-url`` is set.
    """
    deadline = time.monotonic() + timeout
    missing: list[Finding] = []
    if collectors is None:
        collectors = build_collectors(config, condition.collectors if condition else None)
        if condition:
            missing = _not_built(config, [condition], collectors)
    checker = Checker(collectors)
    checker.start()
    findings = _cross_node(config, deadline, condition)
    findings = missing + checker.finish(deadline, timeout) + findings
    checker.close(close_grace)
    return findings, verdict(findings)


def _not_built(config: Config, conditions: Iterable[Condition], built: Mapping[str, Collector]) -> list[Finding]:
    """A condition whose collector is off, or failed to start, cannot be told: never "healthy"."""
    enabled = set(config.enabled_collectors())
    return [
        Finding(name, "unknown", "collector", "collector failed to start" if name in enabled else "collector disabled")
        for condition in conditions for name in condition.collectors if name not in built
    ]


def _cross_node(config: Config, deadline: float, condition: Condition | None) -> list[Finding]:
    """The Prometheus findings, or one "could not tell" about them: never an exception that would take the
    node's own findings (an Xid 79 on its GPU) down with it."""
    if condition is None and not config.check.prometheus_url:
        return []
    if condition is not None and not condition.cross_node:
        return []
    try:
        from fleetscope.check.prometheus import cross_node_findings

        return cross_node_findings(config.check, deadline)
    except Exception as exc:
        logger.debug("cross-node findings", exc_info=True)
        return [Finding(CONDITIONS["training"].name, "unknown", "", one_line(f"{type(exc).__name__}: {exc}"))]


# -- what a check says ----------------------------------------------------------------------------------


def summary(findings: list[Finding], code: int, limit: int = MESSAGE_LIMIT) -> str:
    """One line of at most ``limit`` ASCII characters saying why: the first finding that decided the verdict.

    node-problem-detector cuts a plugin's output at ``max_output_length`` bytes, so the line is plain ASCII
    and cut here, where the cut can keep the count of the other findings.
    """
    if code == EXIT_HEALTHY:
        return "healthy"
    wanted = "unhealthy" if code == EXIT_UNHEALTHY else "unknown"
    deciding = [f for f in findings if f.severity == wanted]
    if not deciding:
        return "could not tell" if code == EXIT_UNKNOWN else "unhealthy"
    first = deciding[0]
    # A device is worth naming ("gpu 3: ..."); "node" says nothing, and a collector that failed is named itself.
    about = {"": "", "node": "", "collector": first.collector}.get(first.subject, first.subject)
    text = f"{about}: {first.message}" if about else first.message
    if code == EXIT_UNKNOWN:
        text = f"could not tell: {text}"
    text = one_line(text.encode("ascii", "replace").decode())
    more = f" (+{len(deciding) - 1} more)" if len(deciding) > 1 else ""
    if len(text) + len(more) > limit:
        text = text[: limit - len(more) - 3].rstrip() + "..."
    return text + more


def condition_findings(condition: Condition, findings: list[Finding]) -> list[Finding]:
    """The findings that belong to one condition (by the collector, or cross-node source, that made them)."""
    sources = {condition.name} | set(condition.collectors)
    return [f for f in findings if f.collector in sources]


def write_verdicts(directory: str, findings: list[Finding], conditions: Iterable[Condition]) -> list[str]:
    """One file per condition: its exit code, its one-line summary, then every finding, replaced atomically.

    node-problem-detector's plugin (deploy/kubernetes/components/node-problem-detector) reads them. Every
    file that can be written is: one that cannot (a full disk, a directory in its place) is logged and
    returned by name, and the others are still written.
    """
    failed = []
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        logger.error("cannot write verdicts into %s: %s", directory, exc)
        return [c.name for c in conditions]
    for condition in conditions:
        own = condition_findings(condition, findings)
        code = verdict(own)
        text = "\n".join([str(code), summary(own, code), *(f.line() for f in own)]) + "\n"
        try:
            _replace(os.path.join(directory, condition.name), text)
        except OSError as exc:
            logger.error("cannot write the %s verdict into %s: %s", condition.name, directory, exc)
            failed.append(condition.name)
    return failed


def _replace(path: str, text: str) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _round(config: Config, checker: Checker, missing: list[Finding], directory: str,
           conditions: list[Condition], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    checker.start()
    cross = _cross_node(config, deadline, CONDITIONS["training"])
    findings = missing + checker.finish(deadline, timeout) + cross
    write_verdicts(directory, findings, conditions)
    if checker.busy:
        logger.warning("collectors still in their health check: %s", ", ".join(sorted(checker.busy)))


def watch(config: Config, directory: str, every: float, timeout: float, rounds: int | None = None) -> None:
    """Write the verdict files every ``every`` seconds (``rounds`` times, or for ever), collectors built once.

    A round lasts at most ``timeout``; a collector stuck in a call from an earlier round stays "could not
    tell" until the call returns, without a new thread each round. With ``rounds=None`` no round ends the
    loop, whatever it meets (the sidecar must not crash-loop): a round that fails is logged, and the next
    one comes ``every`` seconds later.
    """
    conditions = list(CONDITIONS.values())
    checker = Checker(build_collectors(config, [n for c in conditions for n in c.collectors]))
    missing = _not_built(config, conditions, checker.collectors)
    done = 0
    while rounds is None or done < rounds:
        started = time.monotonic()
        try:
            _round(config, checker, missing, directory, conditions, timeout)
        except Exception:
            if rounds is not None:
                raise
            logger.exception("verdict round failed; the next one in %gs", every)
        done += 1
        if rounds is None or done < rounds:
            time.sleep(max(0.0, every - (time.monotonic() - started)))
