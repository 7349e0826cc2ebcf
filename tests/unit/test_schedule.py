"""sepp.Schedule and the occurrence maths: alignment, keys, missed policies, cron and DST."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sepp
from sepp._scheduling.schedule import (
    CronRule,
    EveryRule,
    Rule,
    first_overdue,
    format_occurrence,
    latest_occurrence,
    occurrence_key,
    occurrences_between,
    overdue_to_keep,
)

UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")

instants = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
intervals_us = st.integers(min_value=1_000_000, max_value=7 * 86_400 * 1_000_000)


def rule_of(schedule: sepp.Schedule, name: str) -> Rule:
    return schedule._entries[name].rule


def cron(expression: str, tz: str = "UTC") -> Rule:
    return rule_of(sepp.Schedule().cron("c", expression, "q", "t", tz=tz), "c")


def take(rule: Rule, after: datetime, count: int) -> list[datetime]:
    out = []
    for occurrence in rule.occurrences(after):
        out.append(occurrence)
        if len(out) == count:
            break
    return out


# -- every: alignment --------------------------------------------------------------------------


@given(interval_us=intervals_us, after=instants)
def test_every_occurrences_are_the_multiples_of_the_interval_after_the_start(
    interval_us: int, after: datetime
) -> None:
    first, second, third = take(EveryRule(interval_us), after, 3)
    step = timedelta(microseconds=interval_us)
    assert first > after >= first - step  # the first multiple after `after`, none skipped
    assert (first - EPOCH) % step == timedelta(0)
    assert second - first == step and third - second == step
    assert first.tzinfo is UTC


@given(interval_us=intervals_us, after=instants, span_us=st.integers(0, 10 * 86_400 * 10**6))
def test_latest_every_occurrence_matches_walking_them_all(
    interval_us: int, after: datetime, span_us: int
) -> None:
    rule = EveryRule(interval_us)
    until = after + timedelta(microseconds=span_us)
    walked = occurrences_between(rule, after, until)
    assert latest_occurrence(rule, after, until) == (walked[-1] if walked else None)


def test_every_five_minutes_fires_on_the_clock_face() -> None:
    rule = rule_of(sepp.Schedule().every("r", timedelta(minutes=5), "q", "t"), "r")
    after = datetime(2024, 5, 1, 10, 2, 31, tzinfo=UTC)
    assert take(rule, after, 2) == [
        datetime(2024, 5, 1, 10, 5, tzinfo=UTC),
        datetime(2024, 5, 1, 10, 10, tzinfo=UTC),
    ]


def test_every_accepts_float_seconds() -> None:
    rule = rule_of(sepp.Schedule().every("r", 1.5, "q", "t"), "r")
    assert take(rule, EPOCH, 2) == [EPOCH + timedelta(seconds=1.5), EPOCH + timedelta(seconds=3)]


# -- keys and custom ---------------------------------------------------------------------------


def test_key_and_custom_name_the_schedule_and_the_occurrence_in_utc() -> None:
    schedule = sepp.Schedule().every(
        "reports-5m", 300, "reports", "build", priority=3, custom={"tenant": "acme"}
    )
    occurrence = datetime(2024, 5, 1, 12, 5, tzinfo=ZoneInfo("Europe/Berlin"))  # 10:05 UTC
    request = schedule._entries["reports-5m"].request(occurrence)
    assert request.idempotency_key == "sepp-schedule:reports-5m:2024-05-01T10:05:00Z"
    assert request.scheduled_at == datetime(2024, 5, 1, 10, 5, tzinfo=UTC)
    assert dict(request.custom) == {
        "tenant": "acme",
        "sepp.schedule": "reports-5m",
        "sepp.occurrence": "2024-05-01T10:05:00Z",
    }
    assert (request.queue, request.job_type, request.priority) == ("reports", "build", 3)


@given(instants)
def test_formatted_occurrence_reads_back_as_the_same_instant(when: datetime) -> None:
    text = format_occurrence(when)
    assert text.endswith("Z") and len(text) in (20, 27)
    assert datetime.fromisoformat(text[:-1] + "+00:00") == when
    assert occurrence_key("n", when) == f"sepp-schedule:n:{text}"


def test_sub_second_occurrences_keep_their_microseconds() -> None:
    assert format_occurrence(EPOCH + timedelta(seconds=1.5)) == "1970-01-01T00:00:01.500000Z"


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize("interval", [0.999, timedelta(milliseconds=999), 0, -5])
def test_intervals_under_a_second_are_refused(interval: float | timedelta) -> None:
    with pytest.raises(sepp.ValidationError) as info:
        sepp.Schedule().every("n", interval, "q", "t")
    assert info.value.field == "interval"


def test_names_are_unique_within_a_schedule() -> None:
    schedule = sepp.Schedule().every("n", 1, "q", "t")
    with pytest.raises(sepp.ValidationError, match="already"):
        schedule.every("n", 2, "q", "t")
    with pytest.raises(sepp.ValidationError, match="already"):
        schedule.cron("n", "* * * * *", "q", "t")
    assert schedule.names == ("n",)


@pytest.mark.parametrize("name", ["", "a\nb", "tab\there", "\x00"])
def test_names_must_be_printable_key_material(name: str) -> None:
    with pytest.raises(sepp.ValidationError) as info:
        sepp.Schedule().every(name, 1, "q", "t")
    assert info.value.field == "name"


def test_a_name_whose_keys_would_pass_the_default_key_limit_is_refused() -> None:
    # 14 bytes of prefix + name + ":" + 20 bytes of timestamp = 256 at most.
    fits = "é" * 110 + "x"  # 221 bytes
    sepp.Schedule().every(fits, 1, "q", "t").cron("c" + fits[1:], "* * * * *", "q", "t")
    with pytest.raises(sepp.ValidationError, match="257 bytes"):
        sepp.Schedule().every(fits + "x", 1, "q", "t")
    # Sub-second intervals make longer keys (microseconds).
    with pytest.raises(sepp.ValidationError, match="263 bytes"):
        sepp.Schedule().every(fits, 1.5, "q", "t")


@pytest.mark.parametrize("key", ["sepp.schedule", "sepp.occurrence"])
def test_custom_keys_the_scheduler_sets_are_reserved(key: str) -> None:
    with pytest.raises(sepp.ValidationError, match="set by the scheduler"):
        sepp.Schedule().every("n", 1, "q", "t", custom={key: "x"})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"queue": ""}, "queue"),
        ({"job_type": ""}, "job_type"),
        ({"priority": 10}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"custom": {"k": object()}}, "custom['k']"),
    ],
)
def test_job_fields_are_checked_when_the_entry_is_added(
    kwargs: dict[str, object], field: str
) -> None:
    args: dict[str, object] = {"queue": "q", "job_type": "t", **kwargs}
    with pytest.raises(sepp.ValidationError) as info:
        sepp.Schedule().every("n", 1, **args)  # type: ignore[arg-type]
    assert info.value.field == field


def test_a_bad_cron_expression_or_zone_is_refused() -> None:
    with pytest.raises(sepp.ValidationError, match="not valid") as info:
        sepp.Schedule().cron("n", "61 * * * *", "q", "t")
    assert info.value.field == "expression"
    with pytest.raises(sepp.ValidationError) as info:
        sepp.Schedule().cron("n", "* * * * *", "q", "t", tz="Mars/Olympus")
    assert info.value.field == "tz"


def test_cron_without_the_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)  # makes `import cronsim` fail
    schedule = sepp.Schedule().every("n", 1, "q", "t")  # every() does not need it
    with pytest.raises(ImportError, match=r"sepp-trio\[cron\]"):
        schedule.cron("c", "* * * * *", "q", "t")


def test_repr_lists_the_entries() -> None:
    schedule = sepp.Schedule().every("a", 60, "q", "t").cron("b", "0 3 * * *", "q", "t")
    assert len(schedule) == 2
    assert "a: every 0:01:00" in repr(schedule) and "b: cron '0 3 * * *'" in repr(schedule)


# -- cron and DST ------------------------------------------------------------------------------


def test_cron_fires_on_matching_minutes_in_utc_by_default() -> None:
    after = datetime(2024, 1, 1, 0, 7, 30, tzinfo=UTC)
    assert take(cron("*/15 * * * *"), after, 3) == [
        datetime(2024, 1, 1, 0, 15, tzinfo=UTC),
        datetime(2024, 1, 1, 0, 30, tzinfo=UTC),
        datetime(2024, 1, 1, 0, 45, tzinfo=UTC),
    ]


def test_cron_with_a_seconds_field() -> None:
    after = datetime(2024, 1, 1, tzinfo=UTC)
    assert take(cron("*/20 * * * * *"), after, 2) == [
        after + timedelta(seconds=20),
        after + timedelta(seconds=40),
    ]


def test_cron_follows_the_zone_wall_clock() -> None:
    # 03:00 in Berlin is 02:00 UTC in winter and 01:00 UTC in summer.
    rule = cron("0 3 * * *", "Europe/Berlin")
    assert take(rule, datetime(2024, 1, 10, tzinfo=UTC), 1) == [
        datetime(2024, 1, 10, 2, tzinfo=UTC)
    ]
    assert take(rule, datetime(2024, 7, 10, tzinfo=UTC), 1) == [
        datetime(2024, 7, 10, 1, tzinfo=UTC)
    ]


def test_spring_forward_runs_a_skipped_fixed_time_job_at_the_first_valid_time() -> None:
    # 2024-03-31 Berlin: 02:00 → 03:00. A 02:30 job (Debian cron semantics) runs at 03:00.
    rule = cron("30 2 * * *", "Europe/Berlin")
    got = take(rule, datetime(2024, 3, 30, 12, tzinfo=UTC), 3)
    assert got == [
        datetime(2024, 3, 31, 1, 0, tzinfo=UTC),  # 03:00 CEST
        datetime(2024, 4, 1, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2024, 4, 2, 0, 30, tzinfo=UTC),
    ]


def test_fall_back_runs_a_repeated_fixed_time_job_once() -> None:
    # 2024-10-27 Berlin: 03:00 → 02:00, so 02:30 happens twice; the job runs at the first.
    rule = cron("30 2 * * *", "Europe/Berlin")
    got = take(rule, datetime(2024, 10, 26, 12, tzinfo=UTC), 2)
    assert got == [
        datetime(2024, 10, 27, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2024, 10, 28, 1, 30, tzinfo=UTC),  # 02:30 CET, next day
    ]


def test_fall_back_starting_inside_the_repeated_hour_does_not_repeat_the_job() -> None:
    # Starting at the second 02:10 (01:10 UTC): the 02:30 of that night was at 00:30 UTC.
    rule = cron("30 2 * * *", "Europe/Berlin")
    assert take(rule, datetime(2024, 10, 27, 1, 10, tzinfo=UTC), 1) == [
        datetime(2024, 10, 28, 1, 30, tzinfo=UTC)
    ]


def test_hourly_jobs_follow_the_wall_clock_through_both_transitions() -> None:
    # Jobs with a wildcard hour run as the clock shows: none in the skipped hour, twice in the
    # repeated one (two distinct UTC instants, so two keys).
    rule = cron("0 * * * *", "Europe/Berlin")
    spring = occurrences_between(
        rule, datetime(2024, 3, 30, 23, tzinfo=UTC), datetime(2024, 3, 31, 3, tzinfo=UTC)
    )
    assert [o.astimezone(BERLIN).hour for o in spring] == [1, 3, 4, 5]
    fall = occurrences_between(
        rule, datetime(2024, 10, 26, 23, tzinfo=UTC), datetime(2024, 10, 27, 3, tzinfo=UTC)
    )
    assert [o.astimezone(BERLIN).hour for o in fall] == [2, 2, 3, 4]
    assert fall[1] - fall[0] == timedelta(hours=1)


@given(
    after=instants,
    span_s=st.integers(0, 3 * 86_400),
    expression=st.sampled_from(["* * * * *", "*/7 * * * *", "30 2 * * *", "0 0 * * 1"]),
)
def test_latest_cron_occurrence_matches_walking_them_all(
    after: datetime, span_s: int, expression: str
) -> None:
    rule = cron(expression, "Europe/Berlin")
    until = after + timedelta(seconds=span_s)
    walked = occurrences_between(rule, after, until)
    assert latest_occurrence(rule, after, until) == (walked[-1] if walked else None)


def test_cron_rule_is_used_for_cron_entries() -> None:
    assert isinstance(cron("* * * * *"), CronRule)


# -- missed policies ---------------------------------------------------------------------------

NOW = datetime(2024, 6, 1, 12, 0, 0, tzinfo=UTC)
MINUTES = [NOW - timedelta(minutes=m) for m in (30, 20, 10, 1)]


@pytest.mark.parametrize(
    ("policy", "grace", "kept"),
    [
        ("all", timedelta(0), MINUTES),
        ("latest", timedelta(0), MINUTES[-1:]),
        ("skip", timedelta(0), []),
        ("skip", timedelta(minutes=1), MINUTES[-1:]),  # exactly `grace` old is still kept
        ("skip", timedelta(minutes=15), MINUTES[-2:]),
    ],
)
def test_overdue_occurrences_kept_by_each_policy(
    policy: sepp._scheduling.schedule.Missed, grace: timedelta, kept: list[datetime]
) -> None:
    oldest = NOW - timedelta(hours=1)
    assert overdue_to_keep(policy, MINUTES, NOW, grace=grace, oldest=oldest) == kept


def test_overdue_occurrences_older_than_the_safe_window_are_never_kept() -> None:
    oldest = NOW - timedelta(minutes=15)
    for policy in ("all", "latest", "skip"):
        got = overdue_to_keep(policy, MINUTES[:2], NOW, grace=timedelta(hours=1), oldest=oldest)
        assert got == [], policy
    assert overdue_to_keep("all", MINUTES, NOW, grace=timedelta(0), oldest=oldest) == MINUTES[2:]


@given(
    interval_s=st.integers(1, 7200),
    now=instants,
    policy=st.sampled_from(["latest", "all", "skip"]),
    grace_s=st.integers(0, 3600),
    window_s=st.integers(3601, 4 * 3600),
)
def test_first_overdue_applies_the_policy_to_every_past_occurrence(
    interval_s: int,
    now: datetime,
    policy: sepp._scheduling.schedule.Missed,
    grace_s: int,
    window_s: int,
) -> None:
    rule = EveryRule(interval_s * 1_000_000)
    oldest = now - timedelta(seconds=window_s)
    grace = timedelta(seconds=grace_s)
    everything = occurrences_between(rule, oldest, now)
    expected = overdue_to_keep(policy, everything, now, grace=grace, oldest=oldest)
    assert first_overdue(rule, policy, now, grace=grace, oldest=oldest) == expected


def test_first_overdue_for_a_cron_rule_uses_the_same_policy() -> None:
    rule = cron("0 * * * *")
    oldest = NOW - timedelta(hours=5, minutes=30)
    hours = [NOW - timedelta(hours=h) for h in (5, 4, 3, 2, 1, 0)]
    assert first_overdue(rule, "all", NOW, grace=timedelta(0), oldest=oldest) == hours
    assert first_overdue(rule, "latest", NOW, grace=timedelta(0), oldest=oldest) == [NOW]
    got = first_overdue(rule, "skip", NOW, grace=timedelta(hours=1), oldest=oldest)
    assert got == hours[-2:]
