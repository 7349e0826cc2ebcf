"""The one Prometheus text writer (and its reader, for the supervisor's merge): the format's
details, a round trip through arbitrary label values, and the merge of several texts."""

from __future__ import annotations

import math
import re

from fixtures.fuzz import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sepp._probes import prometheus
from sepp._probes.prometheus import Family, Sample

# One line of the format as Prometheus reads it (no timestamps: we write none).
LINE = re.compile(
    r'^(# (HELP|TYPE) \w+ .+|\w+(\{(\w+="([^"\\\n]|\\.)*",?)*\})? '
    r"(-?\d+(\.\d+)?(e[-+]?\d+)?|[+-]Inf|NaN))$"
)


def test_a_family_is_written_with_its_help_type_and_samples() -> None:
    counter = Family("jobs_total", "counter", "Jobs done.")
    counter.add(3, queue="q", job_type="send")
    counter.add(0.25)
    gauge = Family("lag_seconds", "gauge", None)  # no HELP line
    gauge.add(math.inf)
    gauge.add(-math.inf, side="low")
    gauge.add(math.nan)
    gauge.add(True)
    untyped = Family("bare", None, None, [Sample("bare", (), 7)])
    assert prometheus.write([counter, gauge, untyped]) == (
        "# HELP jobs_total Jobs done.\n"
        "# TYPE jobs_total counter\n"
        'jobs_total{queue="q",job_type="send"} 3\n'
        "jobs_total 0.25\n"
        "# TYPE lag_seconds gauge\n"
        "lag_seconds +Inf\n"
        'lag_seconds{side="low"} -Inf\n'
        "lag_seconds NaN\n"
        "lag_seconds 1\n"
        "bare 7\n"
    )
    assert prometheus.write([]) == ""


def test_a_histogram_has_cumulative_buckets_then_sum_and_count() -> None:
    family = Family("took_seconds", "histogram", "Time.")
    family.add_histogram((0.005, 1, 2.5, 30.0), [1, 0, 2, 0, 1], 0.1 + 0.2, 4, queue="q")
    family.add_histogram((1,), [0, 0], 0.0, 0)
    lines = prometheus.write([family]).splitlines()
    assert lines[2:] == [
        'took_seconds_bucket{queue="q",le="0.005"} 1',
        'took_seconds_bucket{queue="q",le="1"} 1',
        'took_seconds_bucket{queue="q",le="2.5"} 3',
        'took_seconds_bucket{queue="q",le="30"} 3',
        'took_seconds_bucket{queue="q",le="+Inf"} 4',
        'took_seconds_sum{queue="q"} 0.30000000000000004',
        'took_seconds_count{queue="q"} 4',
        'took_seconds_bucket{le="1"} 0',
        'took_seconds_bucket{le="+Inf"} 0',
        "took_seconds_sum 0.0",
        "took_seconds_count 0",
    ]


def test_label_values_and_help_are_escaped() -> None:
    family = Family("m", "gauge", "a \\ and\na new line")
    family.add(1, value='q"x\\y\nz {w}')
    assert prometheus.write([family]).splitlines() == [
        "# HELP m a \\\\ and\\na new line",
        "# TYPE m gauge",
        'm{value="q\\"x\\\\y\\nz {w}"} 1',
    ]


label_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
numbers = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False),  # NaN is never equal to itself: written, below
)
families = st.lists(
    st.builds(
        Family,
        names,
        st.sampled_from(["counter", "gauge", "histogram", "untyped"]),  # a TYPE line each
        st.one_of(st.none(), label_values),
        st.lists(
            st.builds(
                Sample,
                names,
                st.lists(st.tuples(names, label_values), max_size=3).map(tuple),
                numbers,
            ),
            max_size=4,
        ),
    ),
    max_size=4,
    unique_by=lambda family: family.name,
)


@settings(max_examples=examples(200))
@given(families)
def test_what_is_written_reads_back_the_same(written: list[Family]) -> None:
    text = prometheus.write(written)
    lines = text.split("\n")[:-1]  # the format's lines: a label value may hold a \r
    assert all(LINE.match(line) for line in lines if not line.startswith("# HELP"))
    assert prometheus.parse(text) == written


def test_lines_that_cannot_be_read_are_skipped() -> None:
    text = (
        "# a comment\n"
        "\n"
        "orphan 1\n"
        "# TYPE m counter\n"
        'm{a="b"} x\n'  # not a number
        'm{a="unterminated} 1\n'
        "m{a} 1\n"
        'm{a="b"} 2 1700000000000\n'  # a timestamp: the value is kept
        "m\n"
    )
    assert prometheus.parse(text) == [
        Family("orphan", None, None, [Sample("orphan", (), 1)]),
        Family("m", "counter", None, [Sample("m", (("a", "b"),), 2)]),
    ]


def test_the_merge_keeps_each_family_once_with_every_texts_samples_labelled_first() -> None:
    first = Family("jobs_total", "counter", "Jobs.")
    first.add(1, queue="q")
    lag = Family("lag", "gauge", "Lag.")
    lag.add(0.5)
    one = prometheus.write([first, lag])
    other = Family("jobs_total", "counter", "Jobs.")
    other.add(2, queue="q")
    extra = Family("only_here", "gauge", "Once.")
    extra.add(3)
    two = prometheus.write([other, extra])
    merged = prometheus.write(prometheus.merge({"0": one, "1": two}, "process"))
    assert merged.splitlines() == [
        "# HELP jobs_total Jobs.",
        "# TYPE jobs_total counter",
        'jobs_total{process="0",queue="q"} 1',
        'jobs_total{process="1",queue="q"} 2',
        "# HELP lag Lag.",
        "# TYPE lag gauge",
        'lag{process="0"} 0.5',
        "# HELP only_here Once.",
        "# TYPE only_here gauge",
        'only_here{process="1"} 3',
    ]
    assert prometheus.merge({}, "process") == []
