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
