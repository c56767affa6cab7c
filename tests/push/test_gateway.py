from __future__ import annotations

import base64
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetscope.config import PushConfig
from fleetscope.push.gateway import (
    GroupError,
    GroupLimitExceeded,
    GroupStore,
    GroupTooLarge,
    PushedFamily,
    PushedSample,
    parse_exposition,
    parse_group_path,
)
from tests.clocks import FakeClock

KEY = (("job", "train"), ("rank", "0"))
BODY = """# HELP loss Training loss.
# TYPE loss gauge
loss{phase="train"} 2.5
# TYPE examples_total counter
examples_total 128
"""


def test_group_path_with_labels_and_base64() -> None:
    encoded = base64.urlsafe_b64encode(b"a/b").decode()
    assert parse_group_path(f"job/train/path@base64/{encoded}") == (("job", "train"), ("path", "a/b"))
    assert parse_group_path("job@base64/" + base64.urlsafe_b64encode(b"x/y").decode().rstrip("=")) == (
        ("job", "x/y"),
    )


@pytest.mark.parametrize("path", ["job", "rank/0", "job//x/1", "job/a/9bad/1", "job/a/x/1/x/2", "job/a/odd"])
def test_bad_group_paths(path: str) -> None:
    with pytest.raises(GroupError):
        parse_group_path(path)


def test_grouping_labels_override_body_labels() -> None:
    families = parse_exposition('m{rank="7",other="x",training_job="imposter"} 1\n', KEY)
    (sample,) = families[0].samples
    assert dict(sample.labels) == {"job": "train", "rank": "0", "other": "x"}  # job is exposed as training_job


@pytest.mark.parametrize(
    "body,message",
    [
        ("m 1 1700000000000\n", "timestamp"),
        ("fleetscope_training_loss 1\n", "namespace"),
        ('m{a="1"} 1\nm{a="1"} 2\n', "twice"),
        ("this is not { a metric\n", "text format"),
    ],
)
def test_bodies_the_pushgateway_would_refuse(body: str, message: str) -> None:
    with pytest.raises(GroupError, match=message):
        parse_exposition(body, KEY)


def test_put_replaces_the_group_post_replaces_named_families() -> None:
    store = GroupStore(PushConfig())
    store.push(KEY, parse_exposition(BODY, KEY), replace_all=True)
    store.push(KEY, parse_exposition("loss 1.0\n", KEY), replace_all=False)
    (group,), _ = store.view()
    assert {f.name: f.samples[0].value for f in group.families} == {"loss": 1.0, "examples": 128.0}
    store.push(KEY, parse_exposition("other 3\n", KEY), replace_all=True)
    (group,), _ = store.view()
    assert [f.name for f in group.families] == ["other"]


def test_type_conflict_across_groups_is_refused_and_changes_nothing() -> None:
    store = GroupStore(PushConfig())
    store.push(KEY, parse_exposition("# TYPE x gauge\nx 1\n", KEY), replace_all=True)
    other = (("job", "eval"),)
    with pytest.raises(GroupError, match="gauge"):
        store.push(other, parse_exposition("# TYPE x_total counter\nx_total 1\n", other), replace_all=True)
    groups, _ = store.view()
    assert [g.key for g in groups] == [KEY]


def test_groups_expire_after_ttl() -> None:
    clock = FakeClock()
    store = GroupStore(PushConfig(group_ttl=60.0), clock)
    store.push(KEY, (), replace_all=True)
    clock.now += 59
    assert len(store.view()[0]) == 1
    clock.now += 2
    assert store.view() == ((), 1)


def test_a_group_outlives_a_wall_clock_set_forward_and_keeps_its_age_when_set_back() -> None:
    """#30 item 4: set forward 2 h, the Pushgateway group was deleted as if nobody had pushed for 2 h."""
    clock = FakeClock()
    store = GroupStore(PushConfig(group_ttl=60.0), clock)
    store.push(KEY, (), replace_all=True)
    clock.now += 10
    clock.step(7200)
    ((group,), expired) = store.view()
    assert expired == 0 and clock.wall - group.last_push_timestamp == pytest.approx(10.0)
    clock.step(-7800)
    ((group,), _) = store.view()
    assert clock.wall - group.last_push_timestamp == pytest.approx(10.0)
    clock.now += 51
    assert store.view() == ((), 1)


def test_group_limit() -> None:
    store = GroupStore(PushConfig(max_groups=1))
    store.push(KEY, (), replace_all=True)
    store.push(KEY, (), replace_all=True)  # the same group again is fine
    with pytest.raises(GroupLimitExceeded):
        store.push((("job", "other"),), (), replace_all=True)


def test_delete() -> None:
    store = GroupStore(PushConfig())
    store.push(KEY, (), replace_all=True)
    assert store.delete(KEY) and not store.delete(KEY)
    assert store.view()[0] == ()


# -- #18 item 4: a sample budget per group and in all -----------------------------------------------


def one_sample_families(count: int, key=KEY, prefix: str = "fam") -> tuple:
    return parse_exposition("".join(f"# TYPE {prefix}_{i} gauge\n{prefix}_{i} {i}\n" for i in range(count)), key)


def test_a_body_over_the_group_budget_is_refused_before_it_is_parsed() -> None:
    body = "".join(f"m{{a=\"{i}\"}} 1\n" for i in range(11)) + "this line would not parse\n"
    with pytest.raises(GroupTooLarge, match=r"push.max-group-samples"):
        parse_exposition(body, KEY, max_samples=10)


def test_group_and_total_sample_budgets() -> None:
    store = GroupStore(PushConfig(max_group_samples=100, max_samples=250))
    store.push(KEY, one_sample_families(60), replace_all=True)
    with pytest.raises(GroupTooLarge, match="160 samples"):  # a POST adds to what the group holds
        store.push(KEY, one_sample_families(100, prefix="more"), replace_all=False)
    store.push((("job", "b"),), one_sample_families(100, (("job", "b"),), "b"), replace_all=True)
    with pytest.raises(GroupLimitExceeded, match=r"260 samples.*push.max-samples"):
        store.push((("job", "c"),), one_sample_families(100, (("job", "c"),), "c"), replace_all=True)
    assert store.samples() == 160  # nothing from the refused pushes
    store.push(KEY, one_sample_families(10), replace_all=True)  # a PUT gives back what it replaces
    store.push((("job", "c"),), one_sample_families(100, (("job", "c"),), "c"), replace_all=True)
    assert store.samples() == 210
    assert store.delete((("job", "b"),)) and store.samples() == 110


# -- #18 item 5: linear, and nothing slow under the lock scrapes take --------------------------------


def test_a_second_big_group_is_stored_in_linear_time() -> None:
    """20,000 one-sample families in one group, then in a second: the second push took 100 s (quadratic)."""
    store = GroupStore(PushConfig(max_group_samples=20_000, max_samples=40_000))
    first = one_sample_families(20_000)
    store.push(KEY, first, replace_all=True)
    other = (("job", "eval"),)
    second = tuple(PushedFamily(f.name, f.type, f.help, tuple(
        PushedSample(s.name, (("job", "eval"),), s.value) for s in f.samples)) for f in first)
    started = time.perf_counter()
    store.push(other, second, replace_all=True)  # all of it runs under the store's lock
    assert time.perf_counter() - started < 2.0  # ~0.05 s here; the quadratic check took 100 s
    assert store.samples() == 40_000


# -- #18 item 8: nothing accepted may make /metrics unparsable ---------------------------------------


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ('# TYPE s summary\ns{quantile="x"} 1\ns_sum 1\ns_count 1\n', "job/t", "quantile"),
        ('# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 1\ns_count 1\n', "job/t/quantile/x", "grouping label"),
        ('# TYPE h histogram\nh_bucket{le="abc"} 1\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n', "job/t", "le="),
        ('# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n', "job/t/le/abc", "grouping label"),
        ('# TYPE h histogram\nh_bucket{le="1"} 5\nh_bucket{le="2"} 3\nh_sum 1\nh_count 5\n', "job/t", "fewer"),
        ('# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\n', "job/t", "neither a \\+Inf bucket nor a _count"),
        ('# TYPE c_total counter\nc_total -1\n', "job/t", "negative"),
        ('# TYPE s summary\ns{quantile="1.5"} 1\n', "job/t", r"\[0, 1\]"),
        ('# TYPE h_count gauge\nh_count 2\n# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',
         "job/t", "clashes"),
    ],
)
def test_what_would_break_the_scrape_is_refused(body: str, path: str, message: str) -> None:
    key = parse_group_path(path)
    with pytest.raises(GroupError, match=message):
        parse_exposition(body, key)


def test_histogram_without_inf_gets_it_from_its_count() -> None:
    (family,) = parse_exposition('# TYPE h histogram\nh_bucket{le="2"} 3\nh_bucket{le="1"} 1\nh_sum 4\nh_count 3\n',
                                 KEY)
    assert [(s.name, dict(s.labels).get("le"), s.value) for s in family.samples] == [
        ("h_bucket", "1", 1), ("h_bucket", "2", 3), ("h_bucket", "+Inf", 3), ("h_count", None, 3), ("h_sum", None, 4),
    ]


def exposition_parses(store: GroupStore) -> None:
    """Both formats of the groups' exposition parse: OpenMetrics strictly, the text format with promtool's rules."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    from fleetscope.collectors.steps import group_families

    class Groups:
        def collect(self):
            return group_families(store.view()[0])

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Groups())  # type: ignore[arg-type]
    list(parse_openmetrics(generate_openmetrics(registry).decode()))
    list(parse_text(generate_latest(registry).decode()))


NAMES = st.sampled_from(["m", "h", "s", "c", "c_total", "h_bucket", "h_sum", "h_count", "s_sum", "m_created"])
LABEL_VALUES = st.sampled_from(["", "0", "1", "0.5", "+Inf", "-1", "abc", "1e3", "NaN"])
VALUES = st.sampled_from(["0", "1", "2", "-1", "1.5", "NaN", "+Inf", "-Inf", "3"])


@st.composite
def bodies(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["sample", "sample", "sample", "type", "help"]))
        name = draw(NAMES)
        if kind == "type":
            kind_name = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped"]))
            lines.append(f"# TYPE {name} {kind_name}")
        elif kind == "help":
            lines.append(f"# HELP {name} some help")
        else:
            labels = draw(st.dictionaries(st.sampled_from(["le", "quantile", "a", "job"]), LABEL_VALUES, max_size=2))
            rendered = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{rendered}}} {draw(VALUES)}")
    return "".join(line + "\n" for line in lines)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pushes=st.lists(st.tuples(st.sampled_from(["job/a", "job/b", "job/a/le/1", "job/b/quantile/0.5", "job/c/a/1"]),
                                bodies(), st.booleans()), min_size=1, max_size=4))
def test_any_accepted_push_leaves_the_exposition_parsable(pushes: list[tuple[str, str, bool]]) -> None:
    store = GroupStore(PushConfig())
    for path, body, replace_all in pushes:
        key = parse_group_path(path)
        try:
            store.push(key, parse_exposition(body, key), replace_all)
        except GroupError:
            continue
        exposition_parses(store)


# -- #18 item 9: the text format the Pushgateway accepts ---------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('m{a="0"} 1\nm{a="1"} 2\n', {"m": ("unknown", 2)}),  # untyped, repeated: one family
        ('# TYPE g gauge\ng{a="1"} 1\nx 1\ng{a="2"} 2\n', {"g": ("gauge", 2), "x": ("unknown", 1)}),
        ("m 1\n# HELP m help after the sample\n", {"m": ("unknown", 1)}),
        ("# TYPE m GAUGE\nm 1\n", {"m": ("gauge", 1)}),  # the Go parser takes any case
        ("#TYPE m gauge\nm 1\n", {"m": ("gauge", 1)}),
        ("# TYPE\nm 1\n", {"m": ("unknown", 1)}),  # a bare TYPE is a comment
        ("# TYPE c counter\nc 1\n", {"c": ("unknown", 1)}),  # the pushed name c, not c_total
        (
            '# TYPE h histogram\nh_bucket{le="1"} 1\nx 1\nh_sum 1\nh_count 1\n',
            {"h": ("histogram", 4), "x": ("unknown", 1)},
        ),
    ],
)
def test_text_format_the_pushgateway_accepts(body: str, expected: dict) -> None:
    families = {f.name: (f.type, len(f.samples)) for f in parse_exposition(body, KEY)}
    assert families == expected
    help_after = parse_exposition("m 1\n# HELP m help after the sample\n", KEY)
    assert help_after[0].help == "help after the sample"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("m 1\n# TYPE m gauge\n", "after its samples"),
        ("# HELP m a\n# HELP m b\nm 1\n", "second HELP"),
        ("# TYPE m gauge\n# TYPE m gauge\nm 1\n", "second TYPE"),
        ("# TYPE m info\nm 1\n", "unknown metric type"),
        ("# TYPE m unknown\nm 1\n", "unknown metric type"),
        ("m 1", "newline"),
        ("m 1\r\n", "carriage return"),
    ],
)
def test_text_format_the_pushgateway_refuses(body: str, message: str) -> None:
    with pytest.raises(GroupError, match=message):
        parse_exposition(body, KEY)


def test_a_series_another_group_exposes_is_refused() -> None:
    store = GroupStore(PushConfig())
    store.push((("job", "a"),), parse_exposition('m{instance="z"} 1\n', (("job", "a"),)), replace_all=True)
    key = (("job", "a"), ("instance", "z"))
    with pytest.raises(GroupError, match="already pushed by group"):
        store.push(key, parse_exposition("m 1\n", key), replace_all=True)


def test_budget_refusals_over_http_say_why_and_are_counted() -> None:
    from fastapi.testclient import TestClient

    from fleetscope.collectors.steps import StepsCollector
    from fleetscope.config import load
    from fleetscope.daemon import build_daemon

    config = load({"push.max-group-samples": "50", "push.max-samples": "80"}, environ={})
    collector = StepsCollector(config)
    client = TestClient(build_daemon(config, collectors={"steps": collector}).app)
    body = "".join(f'm{{i="{i}"}} 1\n' for i in range(51))
    too_large = client.put("/metrics/job/a", content=body)
    assert too_large.status_code == 413 and "push.max-group-samples" in too_large.json()["detail"]
    assert client.put("/metrics/job/a", content="".join(f'm{{i="{i}"}} 1\n' for i in range(50))).status_code == 200
    over = client.put("/metrics/job/b", content="".join(f'n{{i="{i}"}} 1\n' for i in range(40)))
    assert over.status_code == 429 and "push.max-samples" in over.json()["detail"]
    assert int(over.headers["retry-after"]) > 0
    metrics = client.get("/metrics").text
    assert 'fleetscope_push_rejected_total{reason="too_large"} 1.0' in metrics
    assert 'fleetscope_push_rejected_total{reason="limit"} 1.0' in metrics
    assert "fleetscope_push_group_samples 50.0" in metrics
