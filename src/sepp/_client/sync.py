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

import contextvars
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

from .._model.errors import ClientError, OtherRunError
from .._runtime.blocking_runtime import BLOCKING, run_blocking
from .._runtime.protocol import CancelScope, EventLike, Runtime, TaskGroup
from .._runtime.trio_runtime import TRIO
from .._util.log import Log, LoggerLike
from ..wire import WireEngine
from . import fork
from .batching import Batching
from .client import Client, client_for
from .client import open as open_client
from .options import ConnectOptions
from .replies import Replies
from .retry import RetryPolicy

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..wire.drivers import BlockingChannel

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
        self._current: _Direct | _Portal | RunCalls | None = None
        self._closed = False
        self._replies: Replies | None = None  # made when a first result is awaited
        self._replies_lock = threading.Lock()
        self._results_refused: str | None = None
        _LIVE.add(self)

    @classmethod
    def _over(cls, calls: RunCalls, address: str) -> SyncClient:
        """A client whose calls `calls` hands to the run of its async client (a `def`
        handler's `ctx.client`): it never connects, and `close()` only stops it taking calls.
        It has no options of its own (only a client that connects itself reads them)."""
        client = cls.__new__(cls)
        client._address = address
        client._lock = threading.Lock()
        client._current = calls
        client._closed = False
        client._replies = None
        client._replies_lock = threading.Lock()
        client._results_refused = (
            "a `def` handler's ctx.client does not await results: a handler that waits for"
            " another job holds its worker's slot meanwhile (and every slot so held can"
            " deadlock the worker); chain the jobs (sepp.chain) or enqueue follow-ups"
            " (ctx.then) instead"
        )
        return client

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
        with self._replies_lock:
            replies, self._replies = self._replies, None
        if replies is not None:
            run_blocking(replies.close(BlockingCalls(self)))
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

    def _awaiting_results(self) -> Replies:
        """The reply queue results awaited through this client come to, made by the first
        caller (the others wait for it), its listener a daemon thread making this client's
        calls."""
        if self._results_refused is not None:
            raise ClientError(self._results_refused)
        with self._replies_lock:
            replies = self._replies
            if replies is not None:
                if replies.closed is not None:
                    raise replies.closed
                return replies
            if self._closed:
                raise ClientError(f"this sepp.SyncClient ({self._address}) is closed")
            replies = Replies(BLOCKING, self._log())
            calls = BlockingCalls(self)
            run_blocking(replies.register(calls))
            replies.ready.set()
            self._replies = replies
        threading.Thread(
            target=run_blocking,
            args=(replies.run(calls),),
            name=f"sepp.SyncClient {self._address} replies",
            daemon=True,
        ).start()
        return replies

    def _log(self) -> Log:
        options = getattr(self, "_options", None)
        return options.log if options is not None else Log(None)

    def _engine(self) -> _Direct | _Portal | RunCalls:
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
        self._replies_lock = threading.Lock()
        self._replies = None  # the parent's, its listener a thread the child does not have
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
    """One call handed to a run: the caller waits on `done` for `result`."""

    __slots__ = ("done", "interrupted", "result", "scope")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.result: outcome.Outcome[Any] | None = None
        self.scope: CancelScope | None = None
        self.interrupted = False  # the caller stopped it (KeyboardInterrupt in its thread)


# While a caller waits, it checks this often that the run it handed its call to still exists
# (a loop closed without cancelling its tasks would otherwise leave it waiting forever).
RUN_PROBE_S = 1.0


def _nothing() -> None:
    pass


class RunCalls:
    """Calls of an async `Client` made from other threads: each runs as a task of `tasks`, a
    task group in the client's run (trio or asyncio), in the calling thread's context (its
    context variables: a trace's span), while that thread waits for the result. The engine
    of a portal's `SyncClient` and of a `def` handler's `ctx.client`.

    `close()` ends it: calls still waiting are released and raise `ClientError(cancelled)`,
    later ones `ClientError(closed)` at once; the owner of `tasks` cancels the calls still
    running in it. With `given_up`, a call cancelled by the owner (not by its caller) ends it
    as well, before its caller is released: a call the thread makes next raises `given_up` at
    once instead of starting only to be cancelled in turn. A call made from the run's own
    thread raises (it would wait forever)."""

    def __init__(
        self,
        runtime: Runtime,
        client: Any,
        tasks: TaskGroup,
        *,
        closed: str,
        cancelled: str,
        given_up: str | None = None,
    ) -> None:
        self._rt = runtime
        self.client = client
        self._tasks = tasks
        self._call_soon = runtime.call_soon_handle()
        self._run_thread = threading.get_ident()
        self._closed_message = closed
        self._cancelled_message = cancelled
        self._given_up_message = given_up
        # Calls handed over and not yet finished: close() releases any left, so no caller
        # waits forever.
        self._waiting: set[_Pending] = set()
        self._closed = False

    def run(
        self,
        method: Callable[Concatenate[Client, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run the client's `method(...)` in its run; block until it is done."""
        if threading.get_ident() == self._run_thread:
            raise OtherRunError(
                f"a blocking sepp client called from the event loop it hands its calls to"
                f" would wait forever: call {method.__name__} on the async client there"
            )
        pending = _Pending()
        waiting = self._waiting
        name = method.__name__
        context = contextvars.copy_context()

        async def invoke() -> T:  # looked up in the run, on the client (a fake one, in tests)
            return await getattr(self.client, name)(*args, **kwargs)  # type: ignore[no-any-return]

        async def call() -> None:
            try:
                with self._rt.move_on_at(math.inf) as pending.scope:
                    pending.result = await outcome.acapture(invoke)
                result = pending.result
                if (
                    self._given_up_message is not None
                    and not pending.interrupted
                    and isinstance(result, outcome.Error)
                    and self._rt.is_cancellation(result.error)
                ):
                    self._closed = True
                    self._closed_message = self._given_up_message
            finally:
                finish()

        def start() -> None:  # in the run's thread
            if self._closed:
                finish()
                return
            try:
                context.run(self._tasks.start_soon, call)
            except RuntimeError:  # closing: the task group takes no new calls
                finish()

        def finish() -> None:  # in the run's thread
            if pending in waiting:
                waiting.discard(pending)
                pending.done.release()

        waiting.add(pending)
        if self._closed or not self._call_soon(start):
            waiting.discard(pending)
            raise ClientError(self._closed_message)
        try:
            while not pending.done.acquire(timeout=RUN_PROBE_S):
                if not self._call_soon(_nothing):  # the run is gone
                    waiting.discard(pending)
                    break
        except BaseException:  # KeyboardInterrupt in the caller: stop the call too
            self._cancel(pending)
            raise
        result = pending.result
        if result is None or (
            isinstance(result, outcome.Error) and self._rt.is_cancellation(result.error)
        ):
            raise ClientError(self._cancelled_message)
        return result.unwrap()  # type: ignore[no-any-return]

    def _cancel(self, pending: _Pending) -> None:
        def cancel() -> None:
            pending.interrupted = True
            if pending.scope is not None:
                pending.scope.cancel()

        self._call_soon(cancel)

    def close(self, closed: str | None = None) -> None:
        """Take no more calls (a later one raises `closed`, if given), and release the callers
        still waiting (their result stays None: "cancelled"); in the run's thread."""
        if closed is not None:
            self._closed_message = closed
        self._closed = True
        for pending in list(self._waiting):
            self._waiting.discard(pending)
            pending.done.release()

    def connect(self) -> None:
        """Connected already: the client is the run's."""

    def stop_soon(self) -> None:
        """Take no more calls (from any thread): a closed SyncClient."""
        self._closed = True

    stop = stop_soon


class _Portal:
    """A trio.run in a daemon thread holding one open trio Client, and a nursery in which the
    calls of blocking threads run (`RunCalls`)."""

    def __init__(self) -> None:
        self._rt = TRIO  # the Client that `open_client` opens runs on trio
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._calls: RunCalls
        self._stop: EventLike
        self._origin = fork.here()

    @property
    def client(self) -> Client:
        return self._calls.client  # type: ignore[no-any-return]

    @classmethod
    def start(cls, address: str, options: dict[str, Any]) -> _Portal:
        """Start the thread and connect; raises what open() raises."""
        portal = cls()
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
        calls: RunCalls | None = None
        try:
            async with open_client(address, **options) as client, rt.open_task_group() as nursery:
                calls = self._calls = RunCalls(
                    rt,
                    client,
                    nursery,
                    closed="this sepp.SyncClient is closed",
                    cancelled="this sepp.SyncClient was closed during the call",
                )
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
            if calls is not None:
                calls.close()  # a call that arrived as the client closed fails as closed

    def run(
        self,
        method: Callable[Concatenate[Client, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run `method(client, ...)` in the portal; block until it is done."""
        return self._calls.run(method, *args, **kwargs)

    def connect(self) -> None:
        """Connected already: the portal connects as it starts."""

    def stop_soon(self) -> None:
        """Ask the thread to close the connection and end (from any thread, without waiting).
        Never in a fork() child: the thread and the connection are the parent's."""
        if self._origin.forked:
            return
        self._calls._call_soon(self._stop.set)

    def stop(self) -> None:
        """Close the connection and wait for the thread to end."""
        self.stop_soon()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


def _completing(
    method: Callable[Concatenate[SyncClient, P], T],
) -> Callable[Concatenate[BlockingCalls, P], Coroutine[Any, Any, T]]:
    """A `SyncClient` method as a coroutine method that never suspends: same signature."""

    async def call(self: BlockingCalls, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return method(self._client, *args, **kwargs)

    return call


class BlockingCalls:
    """A `SyncClient`'s calls as a `sepp.Client`'s (`calls.JobsClient`), each complete before
    its await is: what the reply listener and a submission make run under `run_blocking`."""

    __slots__ = ("_client",)

    def __init__(self, client: SyncClient) -> None:
        self._client = client

    enqueue = _completing(SyncClient.enqueue)
    enqueue_atomic = _completing(SyncClient.enqueue_atomic)
    reserve = _completing(SyncClient.reserve)
    ack = _completing(SyncClient.ack)
    nack = _completing(SyncClient.nack)
    extend = _completing(SyncClient.extend)


_LIVE: weakref.WeakSet[SyncClient] = weakref.WeakSet()
# A fork() child's copies of its parent's, never used.
_INHERITED: list[_Direct | _Portal | RunCalls] = []


def _after_fork_in_child() -> None:
    for client in list(_LIVE):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
