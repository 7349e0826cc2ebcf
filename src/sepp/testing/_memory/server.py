"""`MemoryServer`: a sepp server in this process, in memory, on 127.0.0.1; started by
`memory_server()` in a trio run or on an asyncio loop, or by `start()` in a thread of its own
for blocking code."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import TYPE_CHECKING

from ..._model import validate as v
from ..._runtime import wall_clock
from .._server import _with_test_defaults
from .clock import ManualClock, RunClock, ServerClock
from .config import WIRE_ENGINES, ConfigSource, MemoryConfig, parse_config, read_config
from .state import QueueDepths, QueueState

if TYPE_CHECKING:
    from .core import ServerCore

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class MemoryServer:
    """A pure-Python sepp server speaking the real protocol (gRPC over HTTP/2) on loopback,
    with everything in memory: what `sepp.open`, `sepp.SyncClient`, the `sepp-trio` command,
    another process and other sepp clients connect to at `address`.

    Run it with `async with sepp.testing.memory_server(config) as server:` (trio or asyncio),
    as the `memory_server` pytest fixture, or from blocking code with `start()` / `stop()`
    (or `with MemoryServer(config) as server:`), which serve from a thread of their own.

    `config` is what the real server reads (a mapping like `sepp_server`'s, TOML text, or the
    path of a TOML file), with dead letters kept for 10 minutes unless it sets
    `storage.dead_letter_retention_ms`, as `sepp_server()` does; `clock` is the server's
    time: by default the run's wall clock, which in a trio run under
    `trio.testing.MockClock` is virtual time, or a `ManualClock`.
    `wire_engine` is its HTTP/2 side: "codec" (ours, the default) or "h2" (the reference, on
    the h2 library; slower).
    Its state lives as long as the object: `stop()` then `start()` again is a restart that
    keeps every job (leases keep running), as the real server's restart keeps its data."""

    def __init__(
        self,
        config: ConfigSource = None,
        *,
        clock: ServerClock | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        wire_engine: str = "codec",
    ) -> None:
        if wire_engine not in WIRE_ENGINES:
            raise ValueError(f"wire_engine must be one of {WIRE_ENGINES}, got {wire_engine!r}")
        self.wire_engine = wire_engine
        self.config: MemoryConfig = parse_config(_with_test_defaults(read_config(config)))
        self.clock: ServerClock = RunClock() if clock is None else clock
        self.host = host
        self._port = port
        self.state = QueueState(dead_letter_retention_ms=self.config.dead_letter_retention_ms)
        self._core: ServerCore | None = None
        self._thread: threading.Thread | None = None
        self._stop_in_thread: Callable[[], None] | None = None

    # -- what a test looks at ------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port (chosen by the OS on the first start, kept by later starts)."""
        if not self._port:
            raise RuntimeError("the memory server has not been started yet")
        return self._port

    @property
    def address(self) -> str:
        """``"127.0.0.1:PORT"``: what a client connects to."""
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether it serves now (started, and not stopping)."""
        return self._core is not None and not self._core.stopping

    def now(self) -> datetime:
        """The server's clock (what it stamps jobs with and decides leases and schedules by)."""
        return _EPOCH + timedelta(milliseconds=self.clock.now_ms())

    async def advance(self, by: float | timedelta) -> None:
        """Move time on by `by` (seconds or a timedelta) at once: a `ManualClock` is advanced;
        under a trio `MockClock` the run's clock jumps (every sleep and timeout in the run
        sees the jump: what is due fires once, where an autojumping `trio.sleep` of the same
        length would wake each periodic timer on the way, the client's 30 s keepalive check
        and a running Worker's long polls among them); it first lets every task of the run get
        to where it waits, so that no answer is in flight across the jump. Then what fell due
        runs: scheduled jobs become ready, leases expire. On the system's clock time cannot be
        moved (a RuntimeError)."""
        seconds = v.seconds("by", by, allow_zero=True)
        clock = self.clock
        if isinstance(clock, ManualClock):
            clock.advance(seconds)
        else:
            run_clock = wall_clock.trio_clock()
            if run_clock is None or not hasattr(run_clock, "jump"):
                raise RuntimeError(
                    "time can be moved under a trio MockClock or a sepp.testing.ManualClock; "
                    "this memory server runs on the system's clock"
                )
            import trio.testing

            # Nothing in flight across the jump: an answer stamped before it and read after
            # it would be 'by' late for its reader.
            await trio.testing.wait_all_tasks_blocked()
            run_clock.jump(seconds)
        if self._core is not None:
            self._core.on_time()
        await _checkpoint()

    def depths(self, queue: str) -> QueueDepths:
        """How many of `queue`'s jobs are ready, scheduled and in flight, and how many dead
        letters it has (the memory server's own: the real server shows them in its admin UI).
        Timers that have fallen due are applied first."""
        self.state.sweep(self.clock.now_ms())
        return self.state.depths(queue)

    def queues(self) -> list[str]:
        """The queues that hold a job or a dead letter."""
        self.state.sweep(self.clock.now_ms())
        return self.state.queues()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        port = self._port or "?"
        return f"<sepp.testing.MemoryServer {self.host}:{port} {state}>"

    # -- serving ---------------------------------------------------------------------------

    def _new_core(self, runtime_now: Callable[[], float]) -> ServerCore:
        from .core import ServerCore  # the service and protobuf load with the first start

        if self._core is not None and not self._core.stopping:
            raise RuntimeError("the memory server is already running")
        self._core = ServerCore(
            self.config,
            clock=self.clock,
            runtime_now=runtime_now,
            state=self.state,
            wire_engine=self.wire_engine,
        )
        return self._core

    def _installed_clock(self) -> Callable[[], None]:
        """A ManualClock is the run's (or loop's) wall clock while the server runs."""
        if isinstance(self.clock, ManualClock):
            return wall_clock.install(self.clock.wall_ns)
        return _nothing

    @contextlib.asynccontextmanager
    async def _serving_trio(self) -> AsyncIterator[MemoryServer]:
        import trio

        from .trio_driver import TrioDriver

        driver = TrioDriver(self._new_core(trio.current_time))
        uninstall = self._installed_clock()
        try:
            self.host, self._port = await driver.listen(self.host, self._port)
            # The block's exception is carried out of the nursery by hand, so that callers
            # see it as raised, not wrapped in an ExceptionGroup.
            caught: BaseException | None = None
            async with trio.open_nursery() as nursery:
                await nursery.start(driver.run)
                try:
                    yield self
                except BaseException as exc:
                    caught = exc
                finally:
                    with trio.CancelScope(shield=True):
                        await driver.stop()
            if caught is not None:
                raise caught
        finally:
            uninstall()

    @contextlib.asynccontextmanager
    async def _serving_asyncio(self) -> AsyncIterator[MemoryServer]:
        import asyncio

        from .asyncio_driver import AsyncioDriver

        loop = asyncio.get_running_loop()
        driver = AsyncioDriver(self._new_core(loop.time))
        uninstall = self._installed_clock()
        try:
            self.host, self._port = await driver.listen(self.host, self._port)
            try:
                yield self
            finally:
                await asyncio.shield(driver.stop())
        finally:
            uninstall()

    def serving(self) -> contextlib.AbstractAsyncContextManager[MemoryServer]:
        """Serve for the duration of an `async with` block, on the trio run or asyncio loop
        the block runs in."""
        return self._serving_trio() if _in_trio_run() else self._serving_asyncio()

    # -- blocking --------------------------------------------------------------------------

    def start(self) -> MemoryServer:
        """Serve from a thread of its own (real time: a MockClock cannot reach it); returns
        once it accepts connections. Returns the server, so `MemoryServer(...).start()`."""
        if self._thread is not None:
            raise RuntimeError("the memory server is already running")
        import trio

        started = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            stop = trio.Event()
            token = trio.lowlevel.current_trio_token()
            self._stop_in_thread = lambda: token.run_sync_soon(stop.set)
            try:
                async with self._serving_trio():
                    started.set()
                    await stop.wait()
            except BaseException as exc:
                if not started.is_set():
                    failure.append(exc)
                raise
            finally:
                started.set()

        def run() -> None:
            with contextlib.suppress(BaseException):
                trio.run(main)

        self._thread = threading.Thread(target=run, name="sepp.testing.MemoryServer", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stop a server `start()` started (gracefully: waiting reserves return empty,
        connections get GOAWAY); its state is kept for a later `start()`."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._stop_in_thread is not None:
            with contextlib.suppress(Exception):
                self._stop_in_thread()
        thread.join()

    def __enter__(self) -> MemoryServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _nothing() -> None:
    pass


async def _checkpoint() -> None:
    if _in_trio_run():
        import trio

        await trio.lowlevel.checkpoint()
    else:
        import asyncio

        await asyncio.sleep(0)


def _in_trio_run() -> bool:
    return wall_clock.trio_clock() is not None


@contextlib.asynccontextmanager
async def memory_server(
    config: ConfigSource = None,
    *,
    clock: ServerClock | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    wire_engine: str = "codec",
) -> AsyncIterator[MemoryServer]:
    """Run a `MemoryServer` for the duration of the block, in this trio run or on this asyncio
    loop: `async with sepp.testing.memory_server(config) as server:` then connect to
    `server.address`. On exit the server stops as the real one does on SIGTERM: waiting
    reserves return empty, connections get GOAWAY."""
    server = MemoryServer(config, clock=clock, host=host, port=port, wire_engine=wire_engine)
    async with server.serving():
        yield server
