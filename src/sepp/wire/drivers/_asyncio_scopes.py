"""trio's cancel scopes and deadlines, as much of them as the asyncio driver and runtime need,
on every Python we support (asyncio.timeout_at is 3.11+ and cannot be cancelled by hand).

`MoveOnAt` cancels its task's body when the loop's clock reaches a deadline, or when
`cancel()` is called, and swallows only that cancellation: one from outside goes on (on 3.11+
told apart with `uncancel()`, as asyncio.timeout does). `enclosing_deadline()` is the deadline
of an anyio cancel scope around the caller, when anyio runs the code, so it reaches the server
as grpc-timeout as trio's does.
"""

from __future__ import annotations

import asyncio
import math
import sys
from types import TracebackType


class MoveOnAt:
    """A cancel scope over the current task's body, ended at `deadline` on the loop's clock
    (inf: only by `cancel()`)."""

    __slots__ = ("_cancelling", "_fired", "_handle", "_task", "cancelled_caught", "deadline")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.cancelled_caught = False
        self._task: asyncio.Task[object] | None = None
        self._handle: asyncio.Handle | None = None
        self._fired = False
        self._cancelling = 0

    def __enter__(self) -> MoveOnAt:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a cancel scope needs a running asyncio task")
        self._task = task
        self._cancelling = task.cancelling()
        if self.deadline != math.inf:
            loop = asyncio.get_running_loop()
            if self.deadline <= loop.time():
                self._handle = loop.call_soon(self._fire)
            else:
                self._handle = loop.call_at(self.deadline, self._fire)
        return self

    def cancel(self) -> None:
        """End the body at its next suspension (at once if it is suspended)."""
        if self._task is not None:
            self._fire()

    def _fire(self) -> None:
        if not self._fired and self._task is not None:
            self._fired = True
            self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        task, self._task = self._task, None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self._fired or task is None:
            return False
        # Ours, unless the task was also cancelled from outside meanwhile.
        ours = task.uncancel() <= self._cancelling
        if exc_type is not None and issubclass(exc_type, asyncio.CancelledError) and ours:
            self.cancelled_caught = True
            return True
        return False


def enclosing_deadline() -> float:
    """The deadline of the caller's anyio cancel scopes (inf when none, or anyio is not
    running the code); anyio is never imported here, only asked if it is loaded already.

    Asked of anyio's asyncio backend itself: `anyio.current_effective_deadline()` first looks
    the running library up (sniffio), a few microseconds on every call. No anyio scope can
    exist on asyncio before anyio has loaded that backend, which is where its scopes live."""
    backend = sys.modules.get("anyio._backends._asyncio")
    if backend is None:
        return math.inf
    try:
        deadline: float = backend.AsyncIOBackend.current_effective_deadline()
    except Exception:  # an anyio whose backend moved, or not in a task
        return math.inf
    return deadline
