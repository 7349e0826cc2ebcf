"""The memory server's clock: the time its jobs are stamped with and its timers fall due by.

By default (`RunClock`) it is the wall clock that sepp's client and Worker read
(`sepp._runtime.wall_clock`): the system's, or, in a trio run under a `MockClock`, one that
runs with the run's virtual time, so that leases, schedules, retry delays, idempotency
windows and dead-letter retention elapse in virtual time and the client agrees. A
`ManualClock` stands still until the test moves it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Protocol

from ..._model import validate as v
from ..._runtime import wall_clock

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class ServerClock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch."""

    def runtime_at(self, ms: int, runtime_now: float) -> float | None:
        """When, on the runtime's clock (reading `runtime_now` now), this clock reaches
        `ms`; None if it does not move by itself."""

    def watch(self, on_change: Callable[[], None]) -> Callable[[], None]:
        """Call `on_change` whenever the clock is moved by hand; returns what stops it."""


class RunClock:
    """The wall clock of the run (see the module's docstring)."""

    def now_ms(self) -> int:
        return wall_clock.wall_ns() // 1_000_000

    def runtime_at(self, ms: int, runtime_now: float) -> float | None:
        # A microsecond late, so the clock has surely reached `ms` by then.
        return runtime_now + (ms * 1_000_000 - wall_clock.wall_ns()) / 1e9 + 1e-6

    def watch(self, on_change: Callable[[], None]) -> Callable[[], None]:
        return _nothing


def _nothing() -> None:
    pass


class ManualClock:
    """A clock that moves only when told: `advance(seconds or timedelta)`, `set(datetime)`.

    Give it to `memory_server(clock=...)`: while that server runs, the client and the Worker
    in the same trio run (or asyncio loop) read it too, so leases and schedules are decided
    by it alone. It never goes back (`set` to an earlier time is a ValueError). Safe to move
    from any thread."""

    def __init__(self, start: datetime | None = None) -> None:
        if start is None:
            start = datetime.now(timezone.utc)
        self._ns = _ns_of(v.aware_datetime("start", start))
        self._lock = threading.Lock()
        self._watchers: list[Callable[[], None]] = []

    def now(self) -> datetime:
        """The clock's time (UTC)."""
        return _EPOCH + timedelta(microseconds=self._ns // 1000)

    def wall_ns(self) -> int:
        """The clock's time in nanoseconds since the epoch."""
        return self._ns

    def advance(self, by: float | timedelta) -> None:
        """Move the clock forward by `by` (seconds, or a timedelta; not negative)."""
        seconds = v.seconds("by", by, allow_zero=True)
        with self._lock:
            self._ns += round(seconds * 1e9)
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher()

    def set(self, when: datetime) -> None:
        """Move the clock forward to `when` (an aware datetime)."""
        ns = _ns_of(v.aware_datetime("when", when))
        with self._lock:
            if ns < self._ns:
                raise ValueError(f"a ManualClock does not go back: it is at {self.now()}")
            self._ns = ns
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher()

    def now_ms(self) -> int:
        """The clock's time in milliseconds since the epoch (what the server stamps)."""
        return self._ns // 1_000_000

    def runtime_at(self, ms: int, runtime_now: float) -> float | None:
        """Now, if the clock has reached `ms`; else None: it gets there only when moved."""
        return runtime_now if ms * 1_000_000 <= self._ns else None

    def watch(self, on_change: Callable[[], None]) -> Callable[[], None]:
        """Call `on_change` after every move; returns what stops it (for the server's timer)."""
        with self._lock:
            self._watchers.append(on_change)

        def unwatch() -> None:
            with self._lock:
                if on_change in self._watchers:
                    self._watchers.remove(on_change)

        return unwatch

    def __repr__(self) -> str:
        return f"<sepp.testing.ManualClock {self.now().isoformat()}>"


def _ns_of(when: datetime) -> int:
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
