"""SyncClient: the client for blocking code (Django, Flask, scripts).

Every operation is the `Client`'s own coroutine (validation, conversion, errors, retries),
run to its end in the calling thread under the blocking runtime: its channel
(`wire/drivers/_blocking.py`) drives the sans-IO HTTP/2 codec over plain sockets, the calling
threads taking turns as the connection's reader, so calls from many threads are in flight together
on one connection and a lone caller never hands over to another thread.

With `enqueue_batching`, whose linger timer needs a task of its own, the trio `Client` runs
instead in its own `trio.run` on a daemon thread (a "portal", written against the `Runtime`
protocol), and each call is handed to it.
Why: docs/sync.md, "How it works".
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import ssl
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypedDict, TypeVar

import outcome

from .._model.errors import ClientError
from .._runtime.blocking_runtime import BLOCKING, run_blocking
from .._runtime.protocol import CallSoon, CancelScope, EventLike, Runtime, TaskGroup
from .._runtime.trio_runtime import TRIO
from .._util.log import LoggerLike
from ..wire._engine import WireEngine
from . import fork
from .batching import Batching
from .client import Client, client_for
from .client import open as open_client
from .options import ConnectOptions
from .retry import RetryPolicy

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..wire.drivers._blocking import BlockingChannel

P = ParamSpec("P")
T = TypeVar("T")


class ConnectOptionsDict(TypedDict, total=False):
    """The keyword options of `sepp.open()`, which `SyncClient` and `connect` take too."""

    api_key: str | None
    tls: bool | ssl.SSLContext | None
    tls_ca_cert: bytes | str | os.PathLike[str] | None
    tls_domain: str | None
    retry_policy: RetryPolicy | None
    connect_timeout: float | timedelta
    rpc_timeout: float | timedelta | None
    max_receive_message_bytes: int | None
    logger: LoggerLike | None
    keepalive_interval: float | timedelta | None
    keepalive_timeout: float | timedelta
    enqueue_batching: Batching | None
    validate_locally: bool
    wire_engine: WireEngine | None


def _blocking(
    method: Callable[Concatenate[Client, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncClient, P], T]:
    """The blocking twin of a `Client` method: same signature, types, errors and docstring."""

    @functools.wraps(method)
    def call(self: SyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._engine().run(method, *args, **kwargs)

    return call


class SyncClient:
    """A blocking client for code without an event loop: Django and Flask views, scripts,
    notebooks, `def` handlers. Takes the address and the keyword options of `sepp.open()`.

    It connects on first use (within that call's timeout), so a module-level client costs
    nothing at import. Every method of `sepp.Client` is here with the same arguments, results,
    errors, validation, retries and per-call `timeout=`, blocking until done: each runs in the
    calling thread. Any number of threads may share one client: their calls are in flight
    together on its one connection. The caller's thread needs no event loop (in one where
    asyncio or trio runs, a call blocks that loop, as any blocking call does).

    After `os.fork()` (a prefork server, `multiprocessing`) the child never touches the parent's
    connection: its first call opens a new one. `close()` (or leaving `with client:`) closes the
    connection; a closed client raises ClientError.
    """

    def __init__(self, address: str, **options: Unpack[ConnectOptionsDict]) -> None:
        # Every option is checked now, as open() would check it.
        self._options = _checked_options(address, options)
        self._address = self._options.address
        self._connect_args = (address, dict(options))
        self._lock = threading.Lock()
        self._current: _Direct | _Portal | None = None
        self._closed = False
        _LIVE.add(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._current else "not connected"
        return f"<sepp.SyncClient {self._address} {state}>"

    @property
    def address(self) -> str:
        """The address of the server this client connects to."""
        return self._address

    def connect(self) -> None:
        """Connect now rather than on first use (ConnectError if the server is unreachable)."""
        self._engine().connect()

    def close(self) -> None:
        """Close the connection; calls in flight fail, later calls raise ClientError."""
        with self._lock:
            self._closed = True
            engine, self._current = self._current, None
        if engine is not None:
            engine.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    enqueue = _blocking(Client.enqueue)
    enqueue_batch = _blocking(Client.enqueue_batch)
    enqueue_atomic = _blocking(Client.enqueue_atomic)
    reserve = _blocking(Client.reserve)
    ack = _blocking(Client.ack)
    nack = _blocking(Client.nack)
    extend = _blocking(Client.extend)
    drain_dead_letters = _blocking(Client.drain_dead_letters)
    get_server_info = _blocking(Client.get_server_info)

    def _engine(self) -> _Direct | _Portal:
        engine = self._current
        if engine is not None:
            return engine
        with self._lock:
            if self._closed:
                raise ClientError(f"this sepp.SyncClient ({self._address}) is closed")
            if self._current is None:
                if self._options.enqueue_batching is None:
                    self._current = _Direct.start(self._options)
                else:
                    address, options = self._connect_args
                    self._current = _Portal.start(address, options)
                self._current.client.ctx_client = self  # a reserved job's ctx.client
                # A client dropped without close() closes its connection when collected.
                weakref.finalize(self, self._current.stop_soon)
            return self._current

    def _forget_after_fork(self) -> None:
        """In a fork() child: the connection (and a portal's thread) are the parent's; keep
        them out of reach (never closed here) and connect anew on the next call."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        if self._current is not None:
            _INHERITED.append(self._current)
            self._current = None


@contextmanager
def connect(address: str, **options: Unpack[ConnectOptionsDict]) -> Iterator[SyncClient]:
    """Connect a `SyncClient` (the options of `sepp.open()`), closed when the block exits:
    `with sepp.connect("localhost:50051") as client: client.enqueue(...)`."""
    client = SyncClient(address, **options)
    try:
        client.connect()
        yield client
    finally:
        client.close()


_OPEN_SIGNATURE = inspect.signature(open_client)


def _checked_options(address: str, options: ConnectOptionsDict) -> ConnectOptions:
    bound = _OPEN_SIGNATURE.bind(address, **options)  # TypeError for a misspelt option
    bound.apply_defaults()
    return ConnectOptions.parse(**bound.arguments)


class _Direct:
    """The shared `Client` code run in the calling thread, over a blocking channel."""

    def __init__(self, client: Client, channel: BlockingChannel) -> None:
        self.client = client
        self._channel = channel
        self._origin = fork.here()

    @classmethod
    def start(cls, options: ConnectOptions) -> _Direct:
        """Ready to connect: the first call connects, within its own deadline."""
        channel = BLOCKING.channel(options.endpoint, options.channel_options(), None)
        return cls(client_for(options, channel, runtime=BLOCKING), channel)

    def connect(self) -> None:
        """Connect now (within connect_timeout); raises what open() raises."""
        run_blocking(self.client._connect())

    def run(
        self,
        method: Callable[Concatenate[Client, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        return run_blocking(method(self.client, *args, **kwargs))

    def stop_soon(self) -> None:
        """Close the connection; never in a fork() child (it is the parent's)."""
        if not self._origin.forked:
            self._channel.close()

    stop = stop_soon


class _Pending:
    """One call handed to the portal: the caller waits on `done` for `result`."""

    __slots__ = ("done", "result", "scope")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.result: outcome.Outcome[Any] | None = None
        self.scope: CancelScope | None = None


class _Portal:
    """A trio.run in a daemon thread holding one open trio Client, and a nursery in which the
    calls of blocking threads run."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.client: Client
        self._nursery: TaskGroup
        self._call_soon: CallSoon
        self._stop: EventLike
        self._origin = fork.here()
        # Calls handed over and not yet finished; when the run ends, any left (a call that
        # arrived as the client closed) is released, so no caller waits forever.
        self._waiting: set[_Pending] = set()
        self._finished = False

    @classmethod
    def start(cls, address: str, options: dict[str, Any]) -> _Portal:
        """Start the thread and connect; raises what open() raises."""
        portal = cls(TRIO)  # the Client that `open_client` opens runs on trio
        portal._thread = threading.Thread(
            target=portal._rt.run,
            args=(portal._main, address, options),
            name=f"sepp.SyncClient {address}",
            daemon=True,
        )
        portal._thread.start()
        portal._started.wait()
        if portal._failure is not None:
            portal._thread.join()
            failure, portal._failure = portal._failure, None
            raise failure
        return portal

    async def _main(self, address: str, options: dict[str, Any]) -> None:
        rt = self._rt
        try:
            async with open_client(address, **options) as client, rt.open_task_group() as nursery:
                self.client = client
                self._nursery = nursery
                self._call_soon = rt.call_soon_handle()
                self._stop = rt.event()
                self._started.set()
                await rt.wait_event(self._stop, math.inf)
                nursery.cancel_scope.cancel()  # calls still running fail as closed
        except BaseException as exc:
            if self._started.is_set():
                raise
            self._failure = exc
            self._started.set()
        finally:
            self._finished = True
            for pending in list(self._waiting):
                self._waiting.discard(pending)
                pending.done.release()  # its result stays None: "closed"

    def run(
        self,
        method: Callable[Concatenate[Client, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run `method(client, ...)` in the portal; block until it is done."""
        pending = _Pending()
        waiting = self._waiting

        async def call() -> None:
            try:
                with self._rt.move_on_at(math.inf) as pending.scope:
                    pending.result = await outcome.acapture(method, self.client, *args, **kwargs)
            finally:
                finish()

        def start() -> None:  # in the portal's thread
            try:
                self._nursery.start_soon(call)
            except RuntimeError:  # closing: the nursery takes no new calls
                finish()

        def finish() -> None:  # in the portal's thread
            if pending in waiting:
                waiting.discard(pending)
                pending.done.release()

        waiting.add(pending)
        if self._finished:
            waiting.discard(pending)
            raise ClientError("this sepp.SyncClient is closed")
        if not self._call_soon(start):
            waiting.discard(pending)
            raise ClientError("this sepp.SyncClient is closed")
        try:
            pending.done.acquire()
        except BaseException:  # KeyboardInterrupt in the caller: stop the call too
            self._cancel(pending)
            raise
        result = pending.result
        if result is None or (
            isinstance(result, outcome.Error) and self._rt.is_cancellation(result.error)
        ):
            raise ClientError("this sepp.SyncClient was closed during the call")
        return result.unwrap()  # type: ignore[no-any-return]

    def _cancel(self, pending: _Pending) -> None:
        def cancel() -> None:
            if pending.scope is not None:
                pending.scope.cancel()

        self._call_soon(cancel)

    def connect(self) -> None:
        """Connected already: the portal connects as it starts."""

    def stop_soon(self) -> None:
        """Ask the thread to close the connection and end (from any thread, without waiting).
        Never in a fork() child: the thread and the connection are the parent's."""
        if self._origin.forked:
            return
        self._call_soon(self._stop.set)

    def stop(self) -> None:
        """Close the connection and wait for the thread to end."""
        self.stop_soon()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


_LIVE: weakref.WeakSet[SyncClient] = weakref.WeakSet()
_INHERITED: list[_Direct | _Portal] = []  # a fork() child's copies of its parent's, never used


def _after_fork_in_child() -> None:
    for client in list(_LIVE):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
