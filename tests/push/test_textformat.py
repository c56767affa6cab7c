"""A pushed body parsed and checked, as the Pushgateway would (and where it would let the scrape break, refused)."""

from __future__ import annotations

import pytest

from fleetscope.push.grouping import GroupError, parse_group_path
from fleetscope.push.textformat import GroupTooLarge, parse_exposition

KEY = (("job", "train"), ("rank", "0"))
BODY = """# HELP loss Training loss.
# TYPE loss gauge
loss{phase="train"} 2.5
# TYPE examples_total counter
examples_total 128
"""


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


def test_a_body_over_the_group_budget_is_refused_before_it_is_parsed() -> None:
    body = "".join(f"m{{a=\"{i}\"}} 1\n" for i in range(11)) + "this line would not parse\n"
    with pytest.raises(GroupTooLarge, match=r"more than 10 samples, the most one group may hold") as refused:
        parse_exposition(body, KEY, max_samples=10)
    assert refused.value.limit == "max_group_samples"


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
