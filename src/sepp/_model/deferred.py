"""The custom entries a job deferred by a `sepp.Limit` carries (its copy is a new job, with
the attempts the original had left), and the attempt they let a handler be shown: one count
across the copies. `_limits.deferral` makes the copies."""

from __future__ import annotations

from collections.abc import Mapping

ORIGIN = "sepp.deferred.of"  # the first job's id, across every copy
COUNT = "sepp.deferred.n"  # how many times the job was deferred
SPENT = "sepp.deferred.spent"  # attempts spent before this copy (its attempts start after)
ENTRIES = (ORIGIN, COUNT, SPENT)


def spent_attempts(custom: Mapping[str, object]) -> int:
    """Attempts the job spent before this copy of it (0 for a job never deferred)."""
    value = custom.get(SPENT) if custom else None
    return value if type(value) is int and value >= 0 else 0


def origin_id(custom: Mapping[str, object], job_id: str) -> str:
    """The id of the job first enqueued, before any deferral (`job_id` for one never
    deferred): what a job's follow-ups and result are keyed by, so that they are made once
    however many copies the job had."""
    value = custom.get(ORIGIN) if custom else None
    return value if type(value) is str and value else job_id
