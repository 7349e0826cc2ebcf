"""Schedule: named periodic jobs (fixed intervals or cron expressions) and the occurrence maths
that every scheduler must agree on. Pure: no I/O and no clock of its own."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .._model import validate as v
from .._model.errors import ValidationError
from .._model.types import EnqueueRequest, Payload

Missed = Literal["latest", "all", "skip"]
MISSED_POLICIES: tuple[Missed, ...] = ("latest", "all", "skip")

KEY_PREFIX = "sepp-schedule:"
CUSTOM_SCHEDULE_KEY = "sepp.schedule"
CUSTOM_OCCURRENCE_KEY = "sepp.occurrence"
# The server's default `max_idempotency_key_bytes`; the advertised value is checked at start.
DEFAULT_MAX_IDEMPOTENCY_KEY_BYTES = 256
MIN_INTERVAL = timedelta(seconds=1)
CRON_EXTRA_HINT = "pip install 'sepp-trio[cron]'"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
# "2024-01-01T03:00:00Z" and "2024-01-01T03:00:00.000001Z".
_WHOLE_SECOND_STAMP_BYTES = 20
_MICROSECOND_STAMP_BYTES = 27


def format_occurrence(occurrence: datetime) -> str:
    """UTC ISO 8601 with a `Z`, microseconds only when there are any: the same text on every
    host, so it can go into an idempotency key."""
    utc = occurrence.astimezone(timezone.utc).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds" if utc.microsecond else "seconds") + "Z"


def occurrence_key(name: str, occurrence: datetime) -> str:
    return f"{KEY_PREFIX}{name}:{format_occurrence(occurrence)}"


def key_bytes(name: str, *, stamp_bytes: int) -> int:
    """The length of the longest idempotency key `name` can produce."""
    return len(KEY_PREFIX) + len(name.encode("utf-8")) + 1 + stamp_bytes


class Rule(Protocol):
    """When a schedule entry fires."""

    @property
    def stamp_bytes(self) -> int:
        """The longest formatted occurrence this rule can produce, in bytes."""
        ...

    def occurrences(self, after: datetime) -> Iterator[datetime]:
        """Occurrences strictly after `after`, ascending, as UTC datetimes."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class EveryRule:
    """Every `interval_us` microseconds, aligned to multiples of it since the Unix epoch (UTC),
    so every host computes the same instants with integer arithmetic."""

    interval_us: int

    @property
    def stamp_bytes(self) -> int:
        whole = self.interval_us % 1_000_000 == 0
        return _WHOLE_SECOND_STAMP_BYTES if whole else _MICROSECOND_STAMP_BYTES

    def occurrences(self, after: datetime) -> Iterator[datetime]:
        index = (after - _EPOCH) // _MICROSECOND // self.interval_us + 1
        while True:
            try:
                occurrence = _EPOCH + index * self.interval_us * _MICROSECOND
            except OverflowError:  # past year 9999
                return
            yield occurrence
            index += 1

    def latest(self, after: datetime, until: datetime) -> datetime | None:
        """The last occurrence in (after, until], without walking the ones before it."""
        index = (until - _EPOCH) // _MICROSECOND // self.interval_us
        candidate = _EPOCH + index * self.interval_us * _MICROSECOND
        return candidate if candidate > after else None

    def describe(self) -> str:
        return f"every {timedelta(microseconds=self.interval_us)}"


@dataclass(frozen=True, slots=True)
class CronRule:
    """A cron expression evaluated by cronsim in `tz` (Debian cron semantics, DST included)."""

    expression: str
    tz: tzinfo
    cronsim: Any  # the cronsim.CronSim class, imported when the rule was made

    @property
    def stamp_bytes(self) -> int:
        return _WHOLE_SECOND_STAMP_BYTES

    def occurrences(self, after: datetime) -> Iterator[datetime]:
        last = after
        # cronsim works on local wall time; around a fall-back it can restart inside the repeated
        # hour and yield instants we have already passed: keep strictly increasing UTC only.
        for local in self.cronsim(self.expression, after.astimezone(self.tz)):
            occurrence = local.astimezone(timezone.utc)
            if occurrence > last:
                last = occurrence
                yield occurrence

    def describe(self) -> str:
        return f"cron {self.expression!r} in {self.tz}"


def latest_occurrence(rule: Rule, after: datetime, until: datetime) -> datetime | None:
    """The last occurrence of `rule` in (after, until]."""
    if isinstance(rule, EveryRule):
        return rule.latest(after, until)
    # Look back through growing windows, so a dense rule costs a few steps and a sparse one a
    # few windows, instead of walking every occurrence since `after`.
    span = timedelta(minutes=1)
    while True:
        start = max(after, until - span)
        found: datetime | None = None
        for occurrence in rule.occurrences(start):
            if occurrence > until:
                break
            found = occurrence
        if found is not None or start == after:
            return found
        span *= 16


def occurrences_between(rule: Rule, after: datetime, until: datetime) -> list[datetime]:
    """Every occurrence of `rule` in (after, until], ascending."""
    found = []
    for occurrence in rule.occurrences(after):
        if occurrence > until:
            break
        found.append(occurrence)
    return found


def overdue_to_keep(
    policy: Missed,
    overdue: Sequence[datetime],
    now: datetime,
    *,
    grace: timedelta,
    oldest: datetime,
) -> list[datetime]:
    """Of one entry's past occurrences not enqueued yet (ascending), those still to try.

    Older than `oldest` they are never tried: the idempotency key that would show whether some
    scheduler enqueued them may have expired. "skip" keeps them for `grace` after their time,
    "latest" keeps only the newest one, "all" every one.
    """
    live = [occurrence for occurrence in overdue if occurrence > oldest]
    if policy == "all":
        return live
    if policy == "latest":
        return live[-1:]
    return [occurrence for occurrence in live if occurrence >= now - grace]


def first_overdue(
    rule: Rule, policy: Missed, now: datetime, *, grace: timedelta, oldest: datetime
) -> list[datetime]:
    """At start: the past occurrences (≤ now) to enqueue, by the same rule as `overdue_to_keep`
    applied to every occurrence in (oldest, now], without listing them all for "latest"."""
    if policy == "latest":
        latest = latest_occurrence(rule, oldest, now)
        return [] if latest is None else [latest]
    after = oldest if policy == "all" else max(oldest, now - grace - _MICROSECOND)
    return overdue_to_keep(
        policy, occurrences_between(rule, after, now), now, grace=grace, oldest=oldest
    )


@dataclass(frozen=True, slots=True)
class Entry:
    """One named periodic job: when it fires and what it enqueues."""

    name: str
    rule: Rule
    queue: str
    job_type: str
    payload: Payload | None
    priority: int | None
    max_attempts: int | None
    custom: Mapping[str, v.CustomValue]

    def request(self, occurrence: datetime) -> EnqueueRequest:
        stamp = format_occurrence(occurrence)
        return EnqueueRequest(
            self.queue,
            self.job_type,
            payload=self.payload,
            idempotency_key=f"{KEY_PREFIX}{self.name}:{stamp}",
            priority=self.priority,
            max_attempts=self.max_attempts,
            custom={**self.custom, CUSTOM_SCHEDULE_KEY: self.name, CUSTOM_OCCURRENCE_KEY: stamp},
            scheduled_at=occurrence,
        )

    @property
    def max_key_bytes(self) -> int:
        return key_bytes(self.name, stamp_bytes=self.rule.stamp_bytes)


class Schedule:
    """Named periodic jobs for a `sepp.Scheduler`.

    `every(name, interval, queue, job_type, ...)` fires at multiples of `interval` since the
    Unix epoch (UTC); `cron(name, expression, queue, job_type, tz=...)` fires when a cron
    expression matches (needs `sepp-trio[cron]`). Each occurrence is enqueued with
    `scheduled_at` = the occurrence and the idempotency key
    `sepp-schedule:<name>:<occurrence as UTC ISO 8601>`, and its custom map gets
    `sepp.schedule` (the name) and `sepp.occurrence` (the same timestamp text).
    Names are unique within a Schedule. Both methods return the schedule, so calls chain.
    """

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def every(
        self,
        name: str,
        interval: float | timedelta,
        queue: str,
        job_type: str,
        *,
        payload: Payload | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
    ) -> Schedule:
        """Fire every `interval` (seconds or timedelta, at least 1 s)."""
        seconds = v.seconds("interval", interval)
        step = interval if isinstance(interval, timedelta) else timedelta(seconds=seconds)
        if step < MIN_INTERVAL:
            raise ValidationError("interval", f"must be at least 1 second, got {seconds:g}s")
        rule = EveryRule(step // _MICROSECOND)
        return self._add(name, rule, queue, job_type, payload, priority, max_attempts, custom)

    def cron(
        self,
        name: str,
        expression: str,
        queue: str,
        job_type: str,
        *,
        tz: str | tzinfo = "UTC",
        payload: Payload | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
    ) -> Schedule:
        """Fire when the cron `expression` (5 fields, or 6 with seconds first) matches the wall
        clock of `tz` (an IANA name or a tzinfo; default UTC)."""
        cronsim_module = _import_cronsim()
        v.utf8_text("expression", expression)
        zone = _zone(tz)
        try:
            cronsim_module.CronSim(expression, _EPOCH.astimezone(zone))
        except cronsim_module.CronSimError as exc:
            raise ValidationError("expression", f"{expression!r} is not valid: {exc}") from None
        rule = CronRule(expression, zone, cronsim_module.CronSim)
        return self._add(name, rule, queue, job_type, payload, priority, max_attempts, custom)

    @property
    def names(self) -> tuple[str, ...]:
        """The entries' names, in the order they were added."""
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        shown = ", ".join(f"{e.name}: {e.rule.describe()}" for e in self._entries.values())
        return f"<sepp.Schedule {shown or 'empty'}>"

    def _add(
        self,
        name: str,
        rule: Rule,
        queue: str,
        job_type: str,
        payload: Payload | None,
        priority: int | None,
        max_attempts: int | None,
        custom: Mapping[str, v.CustomValue] | None,
    ) -> Schedule:
        _check_name(name)
        if name in self._entries:
            raise ValidationError("name", f"{name!r} is already in this schedule")
        fields = v.custom_map("custom", {} if custom is None else custom)
        for reserved in (CUSTOM_SCHEDULE_KEY, CUSTOM_OCCURRENCE_KEY):
            if reserved in fields:
                raise ValidationError(f"custom[{reserved!r}]", "is set by the scheduler")
        entry = Entry(name, rule, queue, job_type, payload, priority, max_attempts, fields)
        check_key_fits(entry, DEFAULT_MAX_IDEMPOTENCY_KEY_BYTES, "the server's default")
        # Building one request checks queue, job type, payload, priority and the rest now,
        # not at the first occurrence.
        entry.request(_EPOCH)
        self._entries[name] = entry
        return self


def check_key_fits(entry: Entry, limit: int, whose: str) -> None:
    if entry.max_key_bytes > limit:
        raise ValidationError(
            "name",
            f"{entry.name!r} makes idempotency keys of up to {entry.max_key_bytes} bytes;"
            f" {whose} max_idempotency_key_bytes is {limit}",
        )


def _check_name(name: object) -> None:
    text = v.utf8_text("name", name)
    if not text.isprintable():
        raise ValidationError("name", f"must be printable (it goes into keys), got {text!r}")


def _zone(tz: str | tzinfo) -> tzinfo:
    if isinstance(tz, tzinfo):
        return tz
    name = v.utf8_text("tz", tz)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValidationError("tz", f"unknown time zone {name!r} ({exc})") from None


def _import_cronsim() -> Any:
    try:
        return importlib.import_module("cronsim")
    except ImportError:
        raise ImportError(
            f"sepp.Schedule.cron needs the cronsim package: {CRON_EXTRA_HINT}"
        ) from None
