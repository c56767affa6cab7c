"""The Pushgateway routes side by side with the real Pushgateway 1.5.1: the same bodies, the same answers.

Every body is pushed to both. Where the Pushgateway takes it, so does the
daemon, and both expose the same samples (the Pushgateway adds an empty
``instance`` label; the daemon exposes ``job`` as ``training_job``), except
where marked: data the Pushgateway accepts and re-exposes in a form that
OpenMetrics parsers refuse is answered 400 here (the reason is in the case),
and a few lexical liberties of the reference Python parser are accepted.
After every accepted push the daemon's whole /metrics passes
``promtool check metrics`` and the OpenMetrics parser.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import _parse_sample

from tests.conftest import require_binary
from tests.reliability.processes import Daemon, Pushgateway, http

pytestmark = pytest.mark.e2e

OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"}


class Case(NamedTuple):
    name: str
    body: str
    path: str = "job/c"
    ours: int | None = None  # our status where it differs from the Pushgateway's, with the reason
    why: str = ""
    same_samples: bool = True


BROKEN_FOR_OPENMETRICS = "the Pushgateway re-exposes it in a form OpenMetrics parsers refuse"
CASES = [
    # -- the item 9: untyped families, repeated samples, help/type ordering
    Case("untyped repeated", 'm{a="0"} 1\nm{a="1"} 2\n'),
    Case("untyped spread over the body", 'm{a="0"} 1\nx 3\nm{a="1"} 2\n'),
    Case("typed spread over the body", '# TYPE g gauge\ng{a="1"} 1\nx 1\ng{a="2"} 2\n'),
    Case("help after samples", "m 1\n# HELP m help after\n"),
    Case("type before help", "# TYPE m gauge\n# HELP m x\nm 1\n"),
    Case("type after samples", "m 1\n# TYPE m gauge\n"),
    Case("help then type after samples", "# HELP m x\nm 1\n# TYPE m gauge\n"),
    Case("second help", "# HELP m a\n# HELP m b\nm 1\n"),
    Case("second type block", '# TYPE m gauge\nm{a="0"} 1\n# TYPE n gauge\nn 1\n# TYPE m gauge\nm{a="1"} 1\n'),
    Case("type in upper case", "# TYPE m GAUGE\nm 1\n"),
    Case("type without a blank after #", "#TYPE m gauge\nm 1\n"),
    Case("bare type line", "# TYPE\nm 1\n"),
    Case("type for another name", "# TYPE other gauge\nm 1\n"),
    Case("help for another name", "# HELP other x\nm 1\n"),
    Case("type untyped", "# TYPE m untyped\nm 1\n"),
    Case("type info", "# TYPE m info\nm 1\n"),
    Case("type stateset", "# TYPE m stateset\nm 1\n"),
    Case("type gaugehistogram", '# TYPE m gaugehistogram\nm_bucket{le="1"} 1\n'),
    Case("type unknown", "# TYPE m unknown\nm 1\n"),
    Case("same name, other label names", 'm{a="1"} 1\nm{b="1"} 1\n'),
    Case("the same sample twice", 'm{a="0"} 1\nm{a="0"} 2\n'),
    # -- the item 8: what breaks the scrape
    Case("summary quantile x", '# TYPE s summary\ns{quantile="x"} 1\ns_sum 1\ns_count 1\n'),
    Case("summary under a quantile grouping label", '# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 1\ns_count 1\n',
         "job/c/quantile/x"),
    Case("histogram le abc", '# TYPE h histogram\nh_bucket{le="abc"} 1\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n'),
    Case("histogram under a le grouping label", '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',
         "job/c/le/abc", 400, "the Pushgateway exposes two le labels on one bucket"),
    Case("histogram without +Inf", '# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n'),
    Case("histogram buckets out of order", '# TYPE h histogram\nh_bucket{le="2"} 3\nh_bucket{le="1"} 1\n'
         'h_sum 4\nh_count 3\n'),
    Case("histogram buckets decreasing", '# TYPE h histogram\nh_bucket{le="1"} 5\nh_bucket{le="2"} 3\nh_sum 1\n'
         'h_count 5\n', ours=400, why=BROKEN_FOR_OPENMETRICS),
    Case("histogram with only a bucket", '# TYPE h histogram\nh_bucket{le="1"} 1\n', ours=400,
         why=BROKEN_FOR_OPENMETRICS + " (+Inf 0 below a bucket of 1)"),
    Case("histogram without _count", '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 1\n', same_samples=False,
         why="the +Inf bucket is the count; the Pushgateway exposes _count 0"),
    Case("histogram without _sum", '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_count 1\n', ours=400,
         why="the Pushgateway makes up _sum 0"),
    Case("histogram bucket without le", '# TYPE h histogram\nh_bucket 1\nh_sum 1\nh_count 1\n', ours=400,
         why="the Pushgateway drops the bucket silently"),
    Case("histogram le NaN", '# TYPE h histogram\nh_bucket{le="NaN"} 1\nh_sum 1\nh_count 1\n', ours=400,
         why="the Pushgateway drops the bucket silently"),
    Case("histogram le 1 and 1.0", '# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="1.0"} 1\nh_sum 1\n'
         'h_count 1\n', ours=400, why="the Pushgateway exposes the same bucket twice"),
    Case("histogram fractional bucket", '# TYPE h histogram\nh_bucket{le="1"} 1.5\nh_sum 1\nh_count 2\n', ours=400,
         why="the Pushgateway truncates the count"),
    Case("histogram negative _sum", '# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum -1\nh_count 1\n', ours=400,
         why=BROKEN_FOR_OPENMETRICS),
    Case("histogram +Inf differs from _count", '# TYPE h histogram\nh_bucket{le="+Inf"} 3\nh_sum 1\nh_count 5\n',
         ours=400, why=BROKEN_FOR_OPENMETRICS),
    Case("histogram spread over the body", '# TYPE h histogram\nh_bucket{le="1"} 1\nx 1\nh_sum 1\nh_count 1\n'),
    Case("summary without quantile label", "# TYPE s summary\ns 1\n", ours=400,
         why="the Pushgateway drops the sample and makes up _sum and _count 0"),
    Case("summary quantile -1", '# TYPE s summary\ns{quantile="-1"} 1\ns_sum 1\ns_count 1\n', ours=400,
         why=BROKEN_FOR_OPENMETRICS),
    Case("summary negative quantile value", '# TYPE s summary\ns{quantile="0.5"} -1\ns_sum 1\ns_count 1\n',
         ours=400, why=BROKEN_FOR_OPENMETRICS),
    Case("summary _sum without _count", "# TYPE s summary\ns_sum 1\n", ours=400,
         why="the Pushgateway makes up _count 0"),
    Case("summary", '# TYPE s summary\ns{quantile="0.5"} 1\ns{quantile="0.9"} NaN\ns_sum 3\ns_count 2\n'),
    Case("counter named without _total", "# TYPE c counter\nc 1\n", same_samples=True),
    Case("counter negative, without _total", "# TYPE c counter\nc -1\n"),
    Case("counter negative", "# TYPE c_total counter\nc_total -1\n", ours=400, why=BROKEN_FOR_OPENMETRICS),
    Case("counter NaN", "# TYPE c_total counter\nc_total NaN\n", ours=400, why=BROKEN_FOR_OPENMETRICS),
    Case("counter with client_python's _created gauge", "# TYPE c_total counter\nc_total 1\n"
         "# TYPE c_created gauge\nc_created 1.7e9\n", same_samples=False,
         why="c_created is owned by counter c in OpenMetrics and left out"),
    Case("histogram and a gauge named like its _count", '# TYPE h_count gauge\nh_count 2\n# TYPE h histogram\n'
         'h_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n'),
    Case("empty label value beside the same series", 'm{a=""} 1\nm 2\n', ours=400,
         why="an empty label is an absent one: the Pushgateway exposes one series twice"),
    # -- lexical
    Case("timestamp", "m 1 1000\n"),
    Case("float timestamp", "m 1 1.5\n"),
    Case("three fields", "m 1 2 3\n"),
    Case("no final newline", "m 1"),
    Case("carriage return", "m 1\r\n"),
    Case("empty body", ""),
    Case("comment only", "# just a comment\n"),
    Case("blank lines", "\n\nm 1\n\n"),
    Case("tab between name and value", "m\t1\n"),
    Case("value Inf, +inf, nan", "a Inf\nb +inf\nc nan\n"),
    Case("value hex", "m 0x10\n"),
    Case("value with underscore", "m 1_000\n"),
    Case("value missing", "m\n"),
    Case("value not a number", "m abc\n"),
    Case("value out of range", "m 1e999\n", ours=200, why="the Python parser reads it as +Inf"),
    Case("trailing blanks", "m 1  \n", ours=200, why="the Python parser ignores them"),
    Case("metric name with a dash", "m-x 1\n"),
    Case("metric name with a digit first", "1m 1\n"),
    Case("metric name with colons", "a:b 1\n:c 1\n", ours=400,
         why="colons name recording rules: a pushed one forges or blinds them (#35 item 2)"),
    Case("non-ASCII metric name", "é 1\n"),
    Case("label name with a digit first", 'm{1a="x"} 1\n'),
    Case("label name with a dash", 'm{a-b="x"} 1\n'),
    Case("__name__ label", 'm{__name__="x"} 1\n'),
    Case("repeated label name", 'm{a="1",a="2"} 1\n'),
    Case("empty braces, trailing comma, blanks", 'm{} 1\nn{a="b",} 1\no{ a = "b" } 1\n'),
    Case("escapes in label values", 'm{a="b\\"c",d="e\\nf",g="h\\\\i"} 1\n', ours=400,
         why="a newline in a label value would reach check's output as a line of its own (#35 item 1)"),
    Case("escapes in label values but a newline", 'm{a="b\\"c",g="h\\\\i"} 1\n'),
    Case("non-ASCII label value", 'm{a="é"} 1\n'),
    Case("escapes in help", "# HELP m a\\\\b\\nc\nm 1\n"),
    Case("unknown escape in help", "# HELP m a\\tb\nm 1\n", ours=200, why="the Python parser keeps it verbatim"),
    Case("job, instance and training_job labels in the body", 'm{job="x",instance="y"} 1\n'
         'n{training_job="z"} 1\n', same_samples=False, why="the grouping job wins over both job and training_job"),
    Case("label value of 10,000 characters", 'm{a="' + "x" * 10_000 + '"} 1\n', ours=400,
         why="label values are bounded (1,024 characters), so pushes cannot grow /metrics unbounded (#35 item 3)"),
    Case("label value of 1,024 characters", 'm{a="' + "x" * 1_024 + '"} 1\n'),
    # -- grouping keys
    Case("grouping key with labels", "m 1\n", "job/c/instance/i/rank/3"),
    Case("grouping key with base64", "m 1\n", "job@base64/Yy9k"),
    Case("grouping key with a digit-first label", "m 1\n", "job/c/1a/x"),
    Case("grouping key with a reserved label", "m 1\n", "job/c/__x/x"),
    Case("grouping quantile on an untyped family", "m 1\n", "job/c/quantile/x"),
]


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = Daemon.on_p5(Path(tmp_path_factory.mktemp("daemon"))).start()
    yield daemon
    daemon.stop()


def exposed(text: str, job_label: str, job: str) -> set[tuple[str, tuple[tuple[str, str], ...], float | str]]:
    """The samples of one group, without the labels the two servers add differently."""
    out: set[tuple[str, tuple[tuple[str, str], ...], float | str]] = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        # One sample line as written (the family parser renames a counter's samples to *_total).
        sample = _parse_sample(line)
        labels = dict(sample.labels)
        if labels.get(job_label) != job or sample.name.startswith(("fleetscope_", "push_")):
            continue  # the servers' own series about the group
        labels.pop(job_label)
        if labels.get("instance") == "":
            del labels["instance"]
        value: float | str = "NaN" if math.isnan(sample.value) else float(sample.value)
        out.add((sample.name, tuple(sorted(labels.items())), value))
    return out


def check_whole_exposition(daemon: Daemon) -> None:
    _, status, text = daemon.get("/metrics")
    assert status == 200
    promtool = require_binary("promtool")
    linted = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60,
                            check=False)
    # Lint findings about the pushed names (no HELP, camelCase) are the pusher's; a parse error is ours.
    assert b"error while linting" not in linted.stdout + linted.stderr, linted.stdout + linted.stderr
    status, body, _ = http("GET", daemon.url + "/metrics", headers=OPENMETRICS)
    list(parse_openmetrics(body.decode()))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_same_answer_as_the_pushgateway(case: Case, ours: Daemon, pushgateway: Pushgateway) -> None:
    body = case.body.encode()
    headers = {"Content-Type": "text/plain; version=0.0.4"}
    theirs, their_reason, _ = http("PUT", f"{pushgateway.url}/metrics/{case.path}", body, headers)
    mine, my_reason, _ = http("PUT", f"{ours.url}/metrics/{case.path}", body, headers)
    try:
        expected = case.ours if case.ours is not None else theirs
        assert (mine, theirs) == (expected, theirs), (my_reason, their_reason, case.why)
        if mine == 200:
            check_whole_exposition(ours)
            job = case.path.split("/")[1] if not case.path.startswith("job@base64") else "c/d"
            _, _, our_text = ours.get("/metrics")
            _, their_text, _ = http("GET", pushgateway.url + "/metrics")
            if case.same_samples and theirs == 200:
                assert exposed(our_text.decode(), "training_job", job) == exposed(their_text.decode(), "job", job)
    finally:
        http("DELETE", f"{pushgateway.url}/metrics/{case.path}")
        http("DELETE", f"{ours.url}/metrics/{case.path}")


def test_corpus_cases_that_differ_say_why() -> None:
    for case in CASES:
        if case.ours is not None or not case.same_samples:
            assert case.why, case.name
