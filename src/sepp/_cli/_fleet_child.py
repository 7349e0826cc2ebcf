"""One worker process under `sepp-trio worker --processes N`: its side of the supervisor.

The supervisor (`_supervisor`) starts each child with multiprocessing's spawn method and a
pipe (a socket pair). The child runs the ordinary `worker` command and tells the supervisor,
over the pipe, the ports its probes and metrics are on, when it takes signals and when it
reserves; the pipe closing tells the child that the supervisor is gone, and it shuts down
gracefully rather than run on as an orphan.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .._runtime import concurrency

log = logging.getLogger("sepp.cli")


def child_main(
    run: Callable[[argparse.Namespace], int],
    args: argparse.Namespace,
    index: int,
    conn: Connection,
) -> None:
    """A child's entry point (the spawned process's target): `run(args)` with the link to the
    supervisor in `args.fleet`; the process's exit status is what `run` returns."""
    # A process group of its own, so that a Ctrl-C at the terminal reaches the supervisor
    # alone, which passes it on as SIGTERM: one signal per child, not two. The child starts
    # with SIGINT ignored (the supervisor ignores it while starting one): until here a Ctrl-C
    # to the old group cannot kill it half-started.
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args.fleet = SupervisorLink(index, conn)
    sys.exit(run(args))


class SupervisorLink:
    """The child's end of the pipe to its supervisor."""

    def __init__(self, index: int, conn: Connection) -> None:
        self.index = index
        self._conn = conn

    def report(self, **message: Any) -> None:
        """Tell the supervisor something (a few bytes: the write does not block)."""
        try:
            self._conn.send(message)
        except OSError:
            pass  # the supervisor is gone: supervisor_gone() says so

    def accept_signals(self) -> None:
        """The command catches SIGTERM now (the supervisor keeps the ones it has to pass on
        until then, which would kill a child still starting)."""
        self.report(signals=True)

    async def supervisor_gone(self) -> None:
        """Return when the supervisor's end of the pipe closes (it never writes to it): the
        supervisor exited or was killed."""
        if concurrency.current() is concurrency.TRIO:
            import trio

            await trio.lowlevel.wait_readable(self._conn.fileno())
        else:
            import anyio

            await anyio.wait_readable(self._conn.fileno())
