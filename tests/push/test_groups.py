"""The group store: Pushgateway replace semantics, consistency across groups, sample budgets and expiry."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetscope.config import PushConfig
from fleetscope.push.grouping import GroupError, parse_group_path
from fleetscope.push.groups import GroupLimitExceeded, GroupLimits, GroupStore
from fleetscope.push.textformat import GroupTooLarge, PushedFamily, PushedSample, parse_exposition
from tests.clocks import FakeClock

KEY = (("job", "train"), ("rank", "0"))
BODY = """# HELP loss Training loss.
# TYPE loss gauge
loss{phase="train"} 2.5
# TYPE examples_total counter
examples_total 128
"""


def limits(**changes: float) -> GroupLimits:
    """The daemon's default limits (push.* settings), with ``changes``."""
    push = PushConfig()
    defaults = {"max_groups": push.max_groups, "max_group_samples": push.max_group_samples,
                "max_samples": push.max_samples, "ttl": push.group_ttl}
    return GroupLimits(**{**defaults, **changes})  # type: ignore[arg-type]


def test_put_replaces_the_group_post_replaces_named_families() -> None:
    store = GroupStore(limits())
    store.push(KEY, parse_exposition(BODY, KEY), replace_all=True)
    store.push(KEY, parse_exposition("loss 1.0\n", KEY), replace_all=False)
    (group,), _ = store.view()
    assert {f.name: f.samples[0].value for f in group.families} == {"loss": 1.0, "examples": 128.0}
    store.push(KEY, parse_exposition("other 3\n", KEY), replace_all=True)
    (group,), _ = store.view()
    assert [f.name for f in group.families] == ["other"]


def test_type_conflict_across_groups_is_refused_and_changes_nothing() -> None:
    store = GroupStore(limits())
    store.push(KEY, parse_exposition("# TYPE x gauge\nx 1\n", KEY), replace_all=True)
    other = (("job", "eval"),)
    with pytest.raises(GroupError, match="gauge"):
        store.push(other, parse_exposition("# TYPE x_total counter\nx_total 1\n", other), replace_all=True)
    groups, _ = store.view()
    assert [g.key for g in groups] == [KEY]


def test_groups_expire_after_ttl() -> None:
    clock = FakeClock()
    store = GroupStore(limits(ttl=60.0), clock)
    store.push(KEY, (), replace_all=True)
    clock.now += 59
    assert len(store.view()[0]) == 1
    clock.now += 2
    assert store.view() == ((), 1)


def test_a_group_outlives_a_wall_clock_set_forward_and_keeps_its_age_when_set_back() -> None:
    """#30 item 4: set forward 2 h, the Pushgateway group was deleted as if nobody had pushed for 2 h."""
    clock = FakeClock()
    store = GroupStore(limits(ttl=60.0), clock)
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
    store = GroupStore(limits(max_groups=1))
    store.push(KEY, (), replace_all=True)
    store.push(KEY, (), replace_all=True)  # the same group again is fine
    with pytest.raises(GroupLimitExceeded, match="already holds 1 groups") as refused:
        store.push((("job", "other"),), (), replace_all=True)
    assert refused.value.limit == "max_groups"


def test_delete() -> None:
    store = GroupStore(limits())
    store.push(KEY, (), replace_all=True)
    assert store.delete(KEY) and not store.delete(KEY)
    assert store.view()[0] == ()


# -- #18 item 4: a sample budget per group and in all -----------------------------------------------


def one_sample_families(count: int, key=KEY, prefix: str = "fam") -> tuple:
    return parse_exposition("".join(f"# TYPE {prefix}_{i} gauge\n{prefix}_{i} {i}\n" for i in range(count)), key)


def test_group_and_total_sample_budgets() -> None:
    store = GroupStore(limits(max_group_samples=100, max_samples=250))
    store.push(KEY, one_sample_families(60), replace_all=True)
    with pytest.raises(GroupTooLarge, match="160 samples"):  # a POST adds to what the group holds
        store.push(KEY, one_sample_families(100, prefix="more"), replace_all=False)
    store.push((("job", "b"),), one_sample_families(100, (("job", "b"),), "b"), replace_all=True)
    with pytest.raises(GroupLimitExceeded, match=r"260 samples; this node holds at most 250") as refused:
        store.push((("job", "c"),), one_sample_families(100, (("job", "c"),), "c"), replace_all=True)
    assert refused.value.limit == "max_samples"  # the HTTP answer names its setting (tests/push/test_api.py)
    assert store.samples() == 160  # nothing from the refused pushes
    store.push(KEY, one_sample_families(10), replace_all=True)  # a PUT gives back what it replaces
    store.push((("job", "c"),), one_sample_families(100, (("job", "c"),), "c"), replace_all=True)
    assert store.samples() == 210
    assert store.delete((("job", "b"),)) and store.samples() == 110


# -- #18 item 5: linear, and nothing slow under the lock scrapes take --------------------------------


def lines_run_by(call) -> int:
    """Python lines executed in fleetscope/push while ``call()`` runs: its work, whatever the machine's speed."""
    from fleetscope import push

    package = os.path.dirname(push.__file__)
    lines = 0

    def local(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def trace(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(package) else None

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return lines


def second_group_push_lines(count: int) -> int:
    """Lines a PUT of ``count`` one-sample families takes beside a group that already holds ``count`` of them."""
    store = GroupStore(limits(max_group_samples=count, max_samples=2 * count))
    first = one_sample_families(count)
    store.push(KEY, first, replace_all=True)
    other = (("job", "eval"),)
    second = tuple(PushedFamily(f.name, f.type, f.help, tuple(
        PushedSample(s.name, (("job", "eval"),), s.value) for s in f.samples)) for f in first)
    lines = lines_run_by(lambda: store.push(other, second, replace_all=True))  # all of it under the store's lock
    assert store.samples() == 2 * count
    return lines


def test_a_second_big_group_is_stored_in_linear_time() -> None:
    """A second group of N families beside one of N: the quadratic check compared every family with every other
    group's (the second push of 20,000 took 100 s). Counted in executed lines, four times the families cost four
    times the work (sixteen, were it quadratic)."""
    small, large = second_group_push_lines(1_000), second_group_push_lines(4_000)
    assert large / small < 4.5, (small, large)
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
    store = GroupStore(limits())
    for path, body, replace_all in pushes:
        key = parse_group_path(path)
        try:
            store.push(key, parse_exposition(body, key), replace_all)
        except GroupError:
            continue
        exposition_parses(store)


def test_a_series_another_group_exposes_is_refused() -> None:
    store = GroupStore(limits())
    store.push((("job", "a"),), parse_exposition('m{instance="z"} 1\n', (("job", "a"),)), replace_all=True)
    key = (("job", "a"), ("instance", "z"))
    with pytest.raises(GroupError, match="already pushed by group"):
        store.push(key, parse_exposition("m 1\n", key), replace_all=True)
