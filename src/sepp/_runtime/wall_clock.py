"""The wall clock the client and the services read when they relate a server's timestamps
(a lease's expiry, `ServerInfo.server_time`) to their own time.

It is the system's clock, except in two cases a test sets up, where a server in the same
process keeps another time and everything in the run must keep the same:

- in a trio run whose clock is not trio's own (a `trio.testing.MockClock`: virtual time), the
  wall clock runs with the run's clock from an anchor taken once per run (the system's time
  at the first reading), so a 30-day sleep moves it 30 days; `sepp.testing.MemoryServer`
  reads the same clock, so its leases and schedules and the Worker agree;
- a clock installed for the current trio run or asyncio loop (`install`): what
  `sepp.testing.ManualClock` does while a memory server on it runs.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

WallReader = Callable[[], int]  # nanoseconds since the epoch

_RUN_VARS: list[Any] = []  # [anchor RunVar, installed RunVar], made with the first trio run
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_LOOP_CLOCKS: weakref.WeakKeyDictionary[object, WallReader] = weakref.WeakKeyDictionary()


def _run_vars() -> list[Any]:
    if not _RUN_VARS:
        import trio

        _RUN_VARS.extend(
            [trio.lowlevel.RunVar("sepp.wall_anchor"), trio.lowlevel.RunVar("sepp.wall_clock")]
        )
    return _RUN_VARS


def trio_clock() -> Any:
    """The current trio run's clock, or None outside a trio run (trio not even imported)."""
    if "trio" not in sys.modules:
        return None
    import trio

    try:
        return trio.lowlevel.current_clock()
    except RuntimeError:
        return None


def _running_loop() -> object | None:
    if "asyncio" not in sys.modules:
        return None
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def wall_ns() -> int:
    """Nanoseconds since the epoch, on the clock described above."""
    clock = trio_clock()
    if clock is not None:
        anchor_var, installed_var = _run_vars()
        installed: WallReader | None = installed_var.get(None)
        if installed is not None:
            return installed()
        if type(clock).__name__ == "SystemClock":
            return time.time_ns()
        now = clock.current_time()
        anchor = anchor_var.get(None)
        if anchor is None:
            anchor = (time.time_ns(), now)
            anchor_var.set(anchor)
        return int(anchor[0] + round((now - anchor[1]) * 1e9))
    loop = _running_loop()
    if loop is not None:
        reader = _LOOP_CLOCKS.get(loop)
        if reader is not None:
            return reader()
    return time.time_ns()


def utc_now() -> datetime:
    """`wall_ns()` as an aware datetime (UTC)."""
    return _EPOCH + timedelta(microseconds=wall_ns() // 1000)


def virtual() -> bool:
    """Whether the wall clock here follows something other than the system's clock."""
    clock = trio_clock()
    if clock is not None:
        return _run_vars()[1].get(None) is not None or type(clock).__name__ != "SystemClock"
    loop = _running_loop()
    return loop is not None and loop in _LOOP_CLOCKS


def install(reader: WallReader) -> Callable[[], None]:
    """Make `reader` the wall clock of the current trio run or asyncio loop; returns what
    undoes it. Outside both, a RuntimeError."""
    if trio_clock() is not None:
        installed_var = _run_vars()[1]
        installed_var.set(reader)

        def uninstall_trio() -> None:
            if installed_var.get(None) is reader:
                installed_var.set(None)

        return uninstall_trio
    loop = _running_loop()
    if loop is None:
        raise RuntimeError("a clock is installed for a trio run or an asyncio loop: in neither")
    _LOOP_CLOCKS[loop] = reader

    def uninstall_loop() -> None:
        if _LOOP_CLOCKS.get(loop) is reader:
            del _LOOP_CLOCKS[loop]

    return uninstall_loop
