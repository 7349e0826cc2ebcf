"""When the supervisor starts another process in a child's slot, and when it gives up, without
any I/O: a function of the exits it is told of and the times they happened at (as `_outbox`'s
`RelayPolicy` decides for the relay). `Fleet` does the processes and the sleeping."""

from __future__ import annotations

import collections
from dataclasses import dataclass

from ..._model.backoff import backoff_delay
from .._failures import EXIT_USAGE

RESTART_DELAY_S = 0.5  # before the first restart; doubles with each failure in a row
MAX_RESTART_DELAY_S = 30.0
CRASH_LIMIT = 5  # unexpected exits within CRASH_WINDOW_S (all children together)
CRASH_WINDOW_S = 60.0
UNREADY_LIMIT = 3  # exits in a row of one child that never reached "reserving"


@dataclass(frozen=True, slots=True)
class Restart:
    """Start another process in the slot after `delay_s`."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class UsageExit:
    """Stop the group: the child exited with a usage error, which no restart fixes."""


@dataclass(frozen=True, slots=True)
class CrashLoop:
    """Stop the group: `exits` unexpected exits of all children within `window_s`."""

    exits: int
    window_s: float


@dataclass(frozen=True, slots=True)
class NeverReady:
    """Stop the group: the slot's processes exited `exits` times in a row before reserving."""

    exits: int


Decision = Restart | UsageExit | CrashLoop | NeverReady


def restart_delay(failures_in_row: int) -> float:
    """0.5 s, 1 s, 2 s ... up to 30 s."""
    return backoff_delay(
        failures_in_row, initial=RESTART_DELAY_S, multiplier=2.0, cap=MAX_RESTART_DELAY_S
    )


class RestartPolicy:
    """The group's restart decisions: tell it each unexpected exit (not those of a group that
    is stopping), in the order they happen."""

    def __init__(self) -> None:
        self._crashes: collections.deque[float] = collections.deque()  # their times
        self._unready_in_row: dict[int, int] = {}  # by slot
        self._failures_in_row: dict[int, int] = {}

    def exited(self, slot: int, exitcode: int, *, reserved: bool, now: float) -> Decision:
        """What to do after the process in `slot` exited with `exitcode` at `now` (seconds on
        any monotonic clock), having `reserved` or not."""
        if exitcode == EXIT_USAGE:
            return UsageExit()
        unready = 0 if reserved else self._unready_in_row.get(slot, 0) + 1
        failures = 1 if reserved else self._failures_in_row.get(slot, 0) + 1
        self._unready_in_row[slot], self._failures_in_row[slot] = unready, failures
        crashes = self._crashes
        crashes.append(now)
        while crashes and crashes[0] <= now - CRASH_WINDOW_S:
            crashes.popleft()
        if len(crashes) >= CRASH_LIMIT:
            return CrashLoop(len(crashes), CRASH_WINDOW_S)
        if unready >= UNREADY_LIMIT:
            return NeverReady(unready)
        return Restart(restart_delay(failures))
