"""Exponential backoff with jitter, written once: `backoff_delay`, the wait after failures in a
row for every loop that retries (the Worker's reserves, the Scheduler, the outbox relay, the
supervisor's restarts, client retries, the command line's connecting), and `sepp.Backoff`, a
failed job's, on it. Each caller keeps its own parameters."""

from __future__ import annotations

import random
from datetime import timedelta

from . import validate as v
from .errors import ValidationError

# Past this many doublings every step is at its cap anyway; the exponent stops here so that a
# long outage's count never overflows (1000.0 ** 1000 still does: that is caught).
MAX_EXPONENT = 1000


def backoff_delay(
    failures: int,
    *,
    initial: float,
    multiplier: float,
    cap: float,
    jitter: float = 0.0,
    draw: float | None = None,
) -> float:
    """Seconds to wait after `failures` failures in a row (1: the first).

    The step follows gRPC's connection backoff: `initial` after the first failure (even above
    `cap`), then `multiplier` times the one before, at most `cap`. A `jitter` in [0, 1] spreads
    out the callers that failed together: the wait is drawn from [(1 - jitter) * step, step),
    `draw` in [0, 1] placing it (0: the shortest, 1: the full step). Without a `draw`,
    `random.random()` gives one; without jitter nothing is drawn.
    """
    if failures <= 1:
        step = initial
    else:
        try:
            step = min(initial * multiplier ** min(failures - 1, MAX_EXPONENT), cap)
        except OverflowError:
            step = cap
    if not jitter:
        return step
    if draw is None:
        draw = random.random()
    # Written as `1 - jitter * (1 - draw)`, not `(1 - jitter) + jitter * draw`: with a draw of
    # `1 - random.random()` (sepp.Backoff's, the relay's) this is `1 - jitter * random()`
    # exactly, and with jitter 0.5 and `random.random()` it is `random.uniform(0.5, 1.0)`
    # exactly, the two ways the delays were drawn before they were written once.
    return step * (1.0 - jitter * (1.0 - draw))


def shortening_draw() -> float:
    """A draw in (0, 1] for `backoff_delay`: the delay shortened by a random fraction of up to
    the jitter, the full step included, as `sepp.Backoff` and the relay draw it."""
    return 1.0 - random.random()


class Backoff:
    """Exponential backoff with jitter for a failed job's retries.

    After the job's attempt `n` failed, the next attempt waits
    `min(initial * multiplier ** (n - 1), max)` seconds, shortened by a random fraction of up
    to `jitter` (0 keeps the delay exact; 0.5, the default, draws it from (½ delay, delay]) so
    that jobs which failed together do not all come back together. The default, `Backoff()`:
    about 1 s, 2 s, 4 s ... up to 5 minutes.

    Give one to `sepp.Worker(backoff=...)`, `sepp.Router(backoff=...)` or a single handler's
    registration. Durations are seconds (float) or `timedelta`.
    """

    __slots__ = ("initial", "jitter", "max", "multiplier")

    initial: float
    multiplier: float
    max: float
    jitter: float

    def __init__(
        self,
        initial: float | timedelta = 1.0,
        *,
        multiplier: float = 2.0,
        max: float | timedelta = 300.0,
        jitter: float = 0.5,
    ) -> None:
        initial_s = v.seconds("initial", initial, allow_zero=True)
        max_s = v.seconds("max", max, allow_zero=True)
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
            raise ValidationError("multiplier", "must be a number")
        if not 1.0 <= multiplier <= 1000.0:
            raise ValidationError("multiplier", f"must be between 1 and 1000, got {multiplier}")
        if max_s < initial_s:
            raise ValidationError("max", f"must be at least initial ({initial_s:g}s)")
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)):
            raise ValidationError("jitter", "must be a number")
        if not 0.0 <= jitter <= 1.0:
            raise ValidationError("jitter", f"must be between 0 and 1, got {jitter}")
        object.__setattr__(self, "initial", initial_s)
        object.__setattr__(self, "multiplier", float(multiplier))
        object.__setattr__(self, "max", max_s)
        object.__setattr__(self, "jitter", float(jitter))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("sepp.Backoff is immutable")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after attempt `attempt` (1 = the first delivery) failed."""
        return backoff_delay(
            attempt,
            initial=self.initial,
            multiplier=self.multiplier,
            cap=self.max,
            jitter=self.jitter,
            draw=shortening_draw() if self.jitter else None,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Backoff):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[float, float, float, float]:
        return (self.initial, self.multiplier, self.max, self.jitter)

    def __repr__(self) -> str:
        return (
            f"sepp.Backoff({self.initial:g}, multiplier={self.multiplier:g}, max={self.max:g},"
            f" jitter={self.jitter:g})"
        )
