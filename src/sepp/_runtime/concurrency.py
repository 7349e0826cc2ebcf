"""What the services (the Worker with its slots and lease keeper, the Scheduler, the outbox
relay, the command line) take from the runtime layer, in one module: they import these names,
never trio or anyio itself.

A service picks its runtime once, when its `run()` starts (`current()`), and hands it to its
parts: under trio `TRIO`, trio's own functions and classes, so nothing sits between the Worker
and trio; under asyncio (and uvloop) `ASYNCIO` with anyio's members, whose task groups and
cancel scopes have trio's semantics. `protocol.ServiceRuntime` says what each member means.

Beside it, for every runtime: `RunHandle`, calls into a service's run from another thread or
a signal handler; `TaskStatus` and `TASK_STATUS_IGNORED` for
`nursery.start(service.run)` (anyio's `TaskGroup.start` passes its own task status, which has
the same `started()`); `TooSlowError`, what a handler's timeout raises (trio's, on every
runtime).

The monitor's HTTP server (`_probes.server`) is a thread on plain sockets: it needs none of it.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from . import running
from .protocol import CallSoon
from .protocol import CancelScope as CancelScope
from .protocol import Event as Event
from .protocol import Lock as Lock
from .protocol import Nursery as Nursery
from .protocol import ParkingLot as ParkingLot
from .protocol import ServiceRuntime as ServiceRuntime
from .protocol import Spawner as Spawner
from .trio_runtime import TRIO as TRIO

TooSlowError = trio.TooSlowError
TaskStatus = trio.TaskStatus
TASK_STATUS_IGNORED = trio.TASK_STATUS_IGNORED

current = running.service_runtime


class RunHandle:
    """The run a service (Worker, Scheduler, relay) is running in, while it runs, so that a
    request from another thread or a signal handler reaches it: a trio run or an asyncio loop,
    through its runtime's `call_soon_handle()`."""

    __slots__ = ("_call",)

    def __init__(self) -> None:
        self._call: CallSoon | None = None

    def enter(self, runtime: ServiceRuntime) -> None:
        """Called by the service's `run()` when it starts, in the run, with its runtime."""
        self._call = runtime.call_soon_handle()

    def leave(self) -> None:
        self._call = None

    def call(self, fn: Callable[[], None], *, from_task: bool) -> None:
        """Run `fn` in the run: at once when called by one of its tasks (`from_task`), else
        soon (at most one pending call of the same `fn` on trio; `fn` must be idempotent).
        Nothing happens outside `enter()` and `leave()`: the service reads its flags when it
        starts."""
        call = self._call
        if call is None:
            return
        if from_task and call.here():
            fn()
            return
        call(fn, idempotent=True)  # False once the run is over: nothing left to do
