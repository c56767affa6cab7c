"""The grouping key: which group a push goes to, from the URL path ``/metrics/job/<job>{/<label>/<value>}``.

A segment ``<label>@base64`` means its value is URL-safe base64, as the Pushgateway and client_python
use for values containing ``/``. The grouping label ``job`` is exposed as ``training_job``: ``job`` is
Prometheus's own target label (see docs/design.md).
"""

from __future__ import annotations

import base64
import binascii
import re

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
GroupKey = tuple[tuple[str, str], ...]  # (("job", "train"), ("instance", "x")), in URL order
EXPOSED_LABEL = {"job": "training_job"}


class GroupError(ValueError):
    """A push refused as invalid (HTTP 400), with the reason."""


def _decode(segment: str, value: str) -> tuple[str, str]:
    if segment.endswith("@base64"):
        name = segment.removesuffix("@base64")
        padded = value + "=" * (-len(value) % 4)
        try:
            decoded = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            raise GroupError(f"invalid base64 value for label {name!r}") from None
        return name, decoded
    return segment, value


def parse_group_path(path: str) -> GroupKey:
    """``job/train/instance/x`` (the part after ``/metrics/``) -> grouping key.

    A trailing slash is an empty last value (``job/train/instance/`` is ``instance=""``), as in the
    Pushgateway.
    """
    segments = path.removeprefix("/").split("/")
    if len(segments) < 2 or len(segments) % 2:
        raise GroupError("grouping key must be job/<job> followed by <label>/<value> pairs")
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for index in range(0, len(segments), 2):
        name, value = _decode(segments[index], segments[index + 1])
        if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise GroupError(f"invalid label name {name!r} in grouping key")
        if name in seen:
            raise GroupError(f"label {name!r} repeated in grouping key")
        seen.add(name)
        pairs.append((name, value))
    if pairs[0][0] != "job" or not pairs[0][1]:
        raise GroupError("grouping key must start with a non-empty job")
    return tuple(pairs)


