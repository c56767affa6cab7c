"""The grouping key's codec: the URL path after /metrics/ to (label, value) pairs."""

from __future__ import annotations

import base64

import pytest

from fleetscope.push.grouping import GroupError, parse_group_path


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
