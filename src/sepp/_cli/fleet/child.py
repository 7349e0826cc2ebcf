"""One worker process under `sepp-trio worker --processes N`: its side of the supervisor.

The supervisor starts each child with multiprocessing's spawn method and a pipe (a socket
pair). The child runs the ordinary `worker` command, given its `SupervisorLink`, and tells the
supervisor over the pipe (`messages`) the ports its probes and metrics are on, when it takes
signals and when it reserves; its health port also answers the supervisor's `HEALTH_PATH`
with its health as data. The pipe closing tells the child that the supervisor is gone, and it
shuts down gracefully rather than run on as an orphan.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection

from ..._probes.http1 import Route
from ..._runtime import concurrency
from ..._worker.monitor import WorkerMonitor, health_of
from .._signals import ignore_pause_signals
from .messages import HEALTH_CONTENT_TYPE, HEALTH_PATH, Message, Ports, Reserving, TakesSignals
from .messages import encode as encode_message

log = logging.getLogger("sepp.cli")

ChildRun = Callable[[argparse.Namespace, "SupervisorLink"], int]


def child_main(run: ChildRun, args: argparse.Namespace, index: int, conn: Connection) -> None:
    """A child's entry point (the spawned process's target): `run(args, link)`, `link` its end
    of the pipe to the supervisor; the process's exit status is what `run` returns."""
    # A process group of its own, so that a Ctrl-C at the terminal reaches the supervisor
    # alone, which passes it on as SIGTERM: one signal per child, not two. The child starts
    # with SIGINT ignored (the supervisor ignores it while starting one): until here a Ctrl-C
    # to the old group cannot kill it half-started.
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ignore_pause_signals()  # the supervisor's handlers were reset by exec: ignored until caught
    sys.exit(run(args, SupervisorLink(index, conn)))


class SupervisorLink:
    """The child's end of the pipe to its supervisor, and what it serves the supervisor."""

    def __init__(self, index: int, conn: Connection) -> None:
        self.index = index
        self._conn = conn

    def tell(self, message: Message) -> None:
        """Tell the supervisor something (a few bytes: the write does not block)."""
        try:
            self._conn.send_bytes(encode_message(message))
        except OSError:
            pass  # the supervisor is gone: supervisor_gone() says so

    def accept_signals(self) -> None:
        """The command catches SIGTERM now (the supervisor keeps the ones it has to pass on
        until then, which would kill a child still starting)."""
        self.tell(TakesSignals())

    def reserving(self, worker_id: str) -> None:
        self.tell(Reserving(worker_id))

    def serving(self, ports: dict[str, int]) -> None:
        """The ports the probes ("health") and the metrics ("metrics") are served on."""
        self.tell(Ports(ports.get("health"), ports.get("metrics")))

    @staticmethod
    def health_route(monitor: WorkerMonitor) -> dict[str, Route]:
        """The route the supervisor asks on the child's health port: its `Health`."""
        return {HEALTH_PATH: lambda: (200, HEALTH_CONTENT_TYPE, encode_message(health_of(monitor)))}

    async def supervisor_gone(self) -> None:
        """Return when the supervisor's end of the pipe closes (it never writes to it): the
        supervisor exited or was killed."""
        if concurrency.current() is concurrency.TRIO:
            import trio

            await trio.lowlevel.wait_readable(self._conn.fileno())
        else:
            import anyio

            await anyio.wait_readable(self._conn.fileno())
