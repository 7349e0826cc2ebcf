"""Backoff: how long a Worker waits before a failed job's next attempt."""

from __future__ import annotations

import random
from datetime import timedelta

from .._model import validate as v
from .._model.errors import ValidationError


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
        exponent = min(max(attempt - 1, 0), 1000)
        try:
            step = min(self.initial * self.multiplier**exponent, self.max)
        except OverflowError:
            step = self.max
        if self.jitter:
            step *= 1.0 - self.jitter * random.random()
        return step

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


DEFAULT_BACKOFF = Backoff()
# Job types without a handler come back much later than failures: a newer worker that knows
# the type may take minutes to roll out, and each return still costs the job an attempt.
DEFAULT_UNKNOWN_TYPE_BACKOFF = Backoff(60.0, max=3600.0, jitter=0.1)
