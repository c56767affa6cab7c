"""The grouping key: which group a push goes to, from the URL path ``/metrics/job/<job>{/<label>/<value>}``.

A segment ``<label>@base64`` means its value is URL-safe base64, as the Pushgateway and client_python
use for values containing ``/``. The grouping label ``job`` is exposed as ``training_job``: ``job`` is
Prometheus's own target label (see docs/design.md).

What a push may name is bounded here, for the key and the body alike (#35 items 1, 3 and 4): no label
name the exposition gives meaning to (``training_job``, the exposed form of ``job``, and Prometheus's
``__*``), no value with a control character (a label value reaches ``check``'s output, a verdict file
and ``scontrol``: one line each) and none longer than :data:`MAX_LABEL_VALUE_LENGTH` characters.
"""

from __future__ import annotations

import base64
import binascii
import re

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
GroupKey = tuple[tuple[str, str], ...]  # (("job", "train"), ("instance", "x")), in URL order
EXPOSED_LABEL = {"job": "training_job"}
RESERVED_LABELS = frozenset(EXPOSED_LABEL.values())  # a pushed label by such a name would shadow another's
MAX_LABEL_VALUE_LENGTH = 1024  # characters of one label value, in the key or the body
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # and the line and paragraph separators


class GroupError(ValueError):
    """A push refused as invalid (HTTP 400), with the reason; ``reason`` is its refusal counter's label."""

    reason = "invalid"


class ReservedName(GroupError):
    """A push naming a family or label that Prometheus or fleetscope give meaning to (HTTP 400)."""

    reason = "reserved"


def check_label(name: str, value: str, where: str) -> None:
    """Refuse a label whose name is reserved or whose value is too long or holds a control character."""
    if name.startswith("__") or name in RESERVED_LABELS:
        raise ReservedName(f"label {name!r} in {where} is reserved")
    if len(value) > MAX_LABEL_VALUE_LENGTH:
        raise GroupError(f"label {name!r} in {where} has a value of {len(value)} characters; at most "
                         f"{MAX_LABEL_VALUE_LENGTH}")
    if CONTROL.search(value):
        raise GroupError(f"label {name!r} in {where} has a control character in its value")


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
        if not LABEL_NAME.fullmatch(name):
            raise GroupError(f"invalid label name {name!r} in grouping key")
        check_label(name, value, "grouping key")
        if name in seen:
            raise GroupError(f"label {name!r} repeated in grouping key")
        seen.add(name)
        pairs.append((name, value))
    if pairs[0][0] != "job" or not pairs[0][1]:
        raise GroupError("grouping key must start with a non-empty job")
    return tuple(pairs)


