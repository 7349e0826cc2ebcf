"""Which job's handler holds the event loop, and a warning when one holds it too long: an
`async def` handler doing CPU work without awaiting stops everything else in the worker (the
other handlers, lease extensions, reserves), and this says which job does it, as asyncio's
debug mode names a slow callback.

The loop stamps each step of a handler (`stepping`): the job and when the step began, one
immutable tuple in `LoopWatch.current` (a reference written by the loop and read by the
watching thread: atomic, with or without the GIL). The thread looks a few times per threshold
and warns once per step held past it, at most once per `WARNING_INTERVAL_S`; the rest go to
DEBUG and are counted in the next warning."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Awaitable, Generator
from time import monotonic
from typing import TYPE_CHECKING, Any

from .._util.log import Log

if TYPE_CHECKING:
    from .._model.types import JobContext

WARNING_INTERVAL_S = 60.0  # at most one warning per this many seconds (per worker)
_MAX_POLL_S = 0.25  # the thread looks this often at most, and four times per threshold

Step = tuple["JobContext", float]  # the job, and the time.monotonic() its step began


class LoopWatch:
    """Watches the handlers' steps of one Worker's run from a thread of its own (`start()`,
    `stop()`: not a daemon, joined at the end of the run)."""

    __slots__ = (
        "_log",
        "_seen",
        "_stop",
        "_suppressed",
        "_thread",
        "_threshold_s",
        "_warned_at",
        "_worker_id",
        "current",
    )

    def __init__(self, threshold_s: float, log: Log, worker_id: str) -> None:
        self._threshold_s = threshold_s
        self._log = log
        self._worker_id = worker_id
        self.current: Step | None = None  # the step running now, if a handler's
        self._seen: Step | None = None  # the last step warned (or logged at DEBUG) about
        self._warned_at: float | None = None
        self._suppressed = 0  # steps held too long since the last warning, not warned about
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stepping(self, ctx: JobContext, call: Awaitable[object]) -> Awaitable[object]:
        """`call` (the handler's, with its middleware), awaited with each step stamped."""
        return _stepping(self, ctx, call)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._watch, name=f"sepp loop watch {self._worker_id}", daemon=False
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        poll_s = min(max(self._threshold_s / 4, 0.005), _MAX_POLL_S)
        while not self._stop.wait(poll_s):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """Warn if the step running at `now` has held the loop past the threshold (once per
        step; at most once per `WARNING_INTERVAL_S`, else at DEBUG)."""
        step = self.current
        if step is None or step is self._seen:
            return
        ctx, began = step
        held_s = now - began
        if held_s < self._threshold_s:
            return
        self._seen = step
        if self._warned_at is not None and now - self._warned_at < WARNING_INTERVAL_S:
            self._suppressed += 1
            self._log.debug(
                "sepp: worker %s: job %s[%s] has held the event loop for %.2fs (warnings"
                " are limited to one per %gs)",
                self._worker_id,
                ctx.job_type,
                ctx.id,
                held_s,
                WARNING_INTERVAL_S,
            )
            return
        more = (
            f"; {self._suppressed} more step(s) held it that long since the last warning"
            if self._suppressed
            else ""
        )
        self._warned_at = now
        self._suppressed = 0
        self._log.warning(
            "sepp: worker %s: the handler of job %s[%s] (attempt %d, queue %s) has held the"
            " event loop for %.2fs without awaiting; nothing else in this worker runs meanwhile"
            " (other handlers, lease extensions, reserves): run CPU-bound work in a def handler"
            " (a thread) or another process%s",
            self._worker_id,
            ctx.job_type,
            ctx.id,
            ctx.attempt,
            ctx.queue,
            held_s,
            more,
        )


@types.coroutine
def _stepping(
    watch: LoopWatch, ctx: JobContext, call: Awaitable[object]
) -> Generator[Any, Any, Any]:
    """Awaits `call`, stamping `watch.current` before each step of it and clearing it after:
    what the event loop drives (each send, each exception thrown in) goes through here.

    A generator, not an iterator class: its return (and the call's) need no StopIteration
    raised through Python code, which made a one-step handler cost about 4 µs more, not 0.5."""
    inner: Generator[Any, Any, Any] = call.__await__()
    send, throw = inner.send, inner.throw
    value: Any = None
    error: BaseException | None = None
    while True:
        watch.current = (ctx, monotonic())
        try:
            yielded = send(value) if error is None else throw(error)
        except StopIteration as stop:
            return stop.value
        finally:
            watch.current = None
        error = None
        try:
            value = yield yielded
        except GeneratorExit:
            inner.close()
            raise
        except BaseException as exc:  # a cancellation, say: the call's to handle
            value, error = None, exc
