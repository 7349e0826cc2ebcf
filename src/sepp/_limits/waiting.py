"""When a held job waits for a limit, and when it is deferred (docs/limits.md, "Waiting costs
nothing"): a Worker holds at most `max_in_flight` jobs, and of those at most a waiting room's
worth wait for limits, their leases kept by the lease keeper; a job that finds the room full,
or whose patience runs out, is deferred (`deferral`), so the rest of the Worker's capacity
always serves the jobs that can run."""

from __future__ import annotations

from .._model.backoff import backoff_delay, shortening_draw

DEFAULT_PATIENCE_S = 5.0
FIRST_DEFERRAL_S = 1.0
LONGEST_DEFERRAL_S = 60.0


def default_room(max_in_flight: int) -> int:
    """Half the Worker's capacity may wait for limits (at least one job)."""
    return max(1, max_in_flight // 2)


class WaitingRoom:
    """How many of a Worker's held jobs wait for a limit at once."""

    __slots__ = ("capacity", "waiting")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a waiting room holds at least one job")
        self.capacity = capacity
        self.waiting = 0

    def try_enter(self) -> bool:
        if self.waiting >= self.capacity:
            return False
        self.waiting += 1
        return True

    def leave(self) -> None:
        if self.waiting <= 0:
            raise RuntimeError("left a waiting room nobody was in")
        self.waiting -= 1


def deferral_delay_s(
    deferrals_so_far: int,
    hint_s: float | None = None,
    *,
    first_s: float = FIRST_DEFERRAL_S,
    longest_s: float = LONGEST_DEFERRAL_S,
) -> float:
    """How far to defer a job: when its limit says a start will be free (`hint_s`, a local
    rate), else doubling from `first_s` per earlier deferral up to `longest_s`, drawn from
    (½, 1] of that so that jobs deferred together do not all come back together."""
    if hint_s is not None:
        return min(max(hint_s, 0.0), longest_s)
    return backoff_delay(
        deferrals_so_far + 1,
        initial=first_s,
        multiplier=2.0,
        cap=longest_s,
        jitter=0.5,
        draw=shortening_draw(),
    )
