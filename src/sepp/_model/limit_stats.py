"""`LimitStats`: how a `sepp.Limit` stands in one process, for one key (what `ctx.limits`,
the Worker's log lines and its metrics say). A value of its own, below the limiters, so that a
handler's `JobContext` can name its type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LimitStats:
    """One limit's state for one key in this process: how many of its handlers hold an
    admission (`running`) and how many held jobs wait for one (`waiting`), against
    `concurrency` and `rate` per `per` seconds. For a global limit (`scope="global"`) the
    counts are this process's share. `name` is the limit's (a handler's own limit is named
    after its job type); `key` is what the limit's key function gave ("" without one)."""

    name: str | None
    scope: str
    key: str
    running: int
    waiting: int
    concurrency: int | None
    rate: int | None
    per: float
