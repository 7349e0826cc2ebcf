"""A warning, once per call site, for a lease or wait above the server's advertised maximum:
the server silently clamps it, and the usual cause is a duration given in milliseconds."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from types import FrameType

from .._util.log import Log

# Frames in these folders are ours or the runtime's: the call site is the first frame
# outside them (for a Worker, whose reserve comes from its own task, the Worker's frame).
_SEPP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNTIME_DIRS = (f"{os.sep}trio{os.sep}", f"{os.sep}anyio{os.sep}", f"{os.sep}asyncio{os.sep}")
_MAX_SITES = 1024  # warned-about call sites remembered; past that, every site warns again


def _seconds(duration: float | timedelta) -> float:
    return duration.total_seconds() if isinstance(duration, timedelta) else float(duration)


def _call_site() -> str:
    innermost = sys._getframe(2)
    frame: FrameType | None = innermost
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SEPP_DIR) and not any(d in filename for d in _RUNTIME_DIRS):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return f"{innermost.f_code.co_filename}:{innermost.f_lineno}"


class DurationGuard:
    """Warns (through the client's logger) the first time a call site asks for more than the
    server allows; the call goes out unchanged, and the server clamps it."""

    __slots__ = ("_log", "_warned")

    def __init__(self, log: Log) -> None:
        self._log = log
        self._warned: set[tuple[str, str]] = set()

    def check(self, call: str, name: str, duration: float | timedelta, most: timedelta) -> None:
        asked_s = _seconds(duration)
        most_s = most.total_seconds()
        if most_s <= 0 or asked_s <= most_s:
            return
        site = _call_site()
        key = (site, name)
        if key in self._warned:
            return
        if len(self._warned) >= _MAX_SITES:
            self._warned.clear()
        self._warned.add(key)
        hint = f" ({asked_s / 1000:g} s if it was meant in milliseconds)" if asked_s >= 1000 else ""
        self._log.warning(
            "sepp: %s(%s=%g) asks for %g s, above the server's maximum of %g s: the server"
            " will use %g s. Durations are in seconds%s (at %s)",
            call,
            name,
            asked_s,
            asked_s,
            most_s,
            most_s,
            hint,
            site,
        )
