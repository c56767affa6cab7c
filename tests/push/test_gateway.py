from __future__ import annotations

import base64

import pytest

from fleetscope.config import PushConfig
from fleetscope.push.gateway import (
    GroupError,
    GroupLimitExceeded,
    GroupStore,
    parse_exposition,
    parse_group_path,
)

KEY = (("job", "train"), ("rank", "0"))
BODY = """# HELP loss Training loss.
# TYPE loss gauge
loss{phase="train"} 2.5
# TYPE examples_total counter
examples_total 128
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


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
