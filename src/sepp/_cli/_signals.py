"""Running a long-lived command until SIGINT/SIGTERM, with escalation on repeated signals.

Shared by the commands that run a service (`worker`, `scheduler`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractContextManager

import trio

from .._runtime import concurrency

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# `sepp-trio worker`: SIGUSR1 pauses (no new jobs; what is held runs), SIGUSR2 resumes. None
# where the platform has no such signals (Windows).
PAUSE_SIGNAL = getattr(signal, "SIGUSR1", None)
RESUME_SIGNAL = getattr(signal, "SIGUSR2", None)
log = logging.getLogger("sepp.cli")


async def run_until_signalled(
    body: Callable[[], Awaitable[None]],
    steps: Sequence[Callable[[signal.Signals], None]],
) -> bool:
    """Run `body` with SIGINT and SIGTERM caught: the n-th signal calls `steps[n - 1]` (e.g.
    a graceful stop, then an immediate one), which should make `body` return. One signal more
    than there are steps cancels `body` outright. Returns True if it came to that. Runs on
    trio, or on asyncio with anyio's signal receiver (the loop's signal handlers, for as long
    as the command runs)."""
    failure: Exception | None = None
    hard_stopped = False
    cc = concurrency.current()
    receiver: AbstractContextManager[AsyncIterator[int]]
    if cc is concurrency.TRIO:
        receiver = trio.open_signal_receiver(*STOP_SIGNALS)
    else:
        import anyio

        receiver = anyio.open_signal_receiver(*STOP_SIGNALS)
    with receiver as received:
        async with cc.open_nursery() as nursery:

            async def escalate() -> None:
                nonlocal hard_stopped
                count = 0
                async for signum in received:
                    sig = signal.Signals(signum)
                    if count < len(steps):
                        steps[count](sig)
                        count += 1
                    else:
                        log.warning("%s again: stopping at once", sig.name)
                        hard_stopped = True
                        nursery.cancel_scope.cancel()

            nursery.start_soon(escalate)
            try:
                await body()
            except Exception as exc:
                # Re-raised below, outside the nursery, so it is not wrapped in a group.
                failure = exc
            finally:
                nursery.cancel_scope.cancel()
    if failure is not None:
        try:
            raise failure
        finally:
            failure = None
    return hard_stopped


def ignore_pause_signals() -> None:
    """Until `on_pause_signals` catches them: ignored, so that one sent while the worker command
    starts (importing its target, say) does not end the process, as their default action
    would. Ignored stays ignored across exec, for the processes a supervisor starts too."""
    for sig in (PAUSE_SIGNAL, RESUME_SIGNAL):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)


async def on_pause_signals(
    pause: Callable[[signal.Signals], None],
    resume: Callable[[signal.Signals], None],
    *,
    task_status: concurrency.TaskStatus[None] = concurrency.TASK_STATUS_IGNORED,
) -> None:
    """Until cancelled: SIGUSR1 calls `pause`, SIGUSR2 `resume`. `nursery.start()` returns once
    they are caught (before, their default action ends the process); on trio, or on asyncio
    with anyio's receiver. Where the platform has neither, nothing is caught."""
    if PAUSE_SIGNAL is None or RESUME_SIGNAL is None:
        task_status.started()
        return
    cc = concurrency.current()
    receiver: AbstractContextManager[AsyncIterator[int]]
    if cc is concurrency.TRIO:
        receiver = trio.open_signal_receiver(PAUSE_SIGNAL, RESUME_SIGNAL)
    else:
        import anyio

        receiver = anyio.open_signal_receiver(PAUSE_SIGNAL, RESUME_SIGNAL)
    with receiver as received:
        task_status.started()
        async for signum in received:
            sig = signal.Signals(signum)
            (pause if sig == PAUSE_SIGNAL else resume)(sig)
