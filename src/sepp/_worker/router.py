"""Router: the registry of job handlers. A Worker keeps one; users build their own without a
client and hand it to a Worker later."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, overload

from .._model import validate as v
from .._model.backoff import Backoff
from .._model.errors import SeppError, ValidationError
from .._model.settlement import OnInvalid, check_on_invalid
from .._model.types import JobContext, Payload, Retry
from .dead_letter_hooks import DeadLetterHook, HookCall, checked_hook
from .failure_policy import ExceptionTypes, checked_exception_types
from .limit_uses import LimitSetting, LimitUse, check_one_value_per_name, checked_limits
from .middleware import Middleware, checked_middleware
from .thread_handlers import SyncHandler, SyncJobContext, is_sync_function, run_in_thread

if TYPE_CHECKING:
    from .._payloads.task import Task

Handler = Callable[[Payload | None, JobContext], Awaitable[object]]
"""An async function `(payload, ctx)` that processes one job (what it returns is the job's
result, for a chain's next step or an awaiting client; None for most). A plain `def` function
is accepted too: it runs in a worker thread, its `ctx` a `sepp.SyncJobContext` whose client
blocks (see "Synchronous code" in the docs)."""

H = TypeVar("H", bound=Callable[[Any, JobContext], Awaitable[object]] | SyncHandler)
T = TypeVar("T")
R = TypeVar("R")

# A task's handler: `async def` or `def` (run in a worker thread, with a SyncJobContext),
# taking the decoded payload and returning the task's result.
TaskHandler = Callable[[T, JobContext], Awaitable[R]] | Callable[[T, SyncJobContext], R]


class TaskDecorator(Protocol[T, R]):
    """What `Router.task(...)` returns: a decorator that keeps the handler as it is."""

    @overload
    def __call__(
        self, fn: Callable[[T, JobContext], Awaitable[R]], /
    ) -> Callable[[T, JobContext], Awaitable[R]]: ...

    @overload
    def __call__(
        self, fn: Callable[[T, SyncJobContext], R], /
    ) -> Callable[[T, SyncJobContext], R]: ...


# Takes the sepp.Worker, or nothing (typed Any: router cannot import worker).
Lifespan = (
    Callable[[Any], AbstractAsyncContextManager[Any]]
    | Callable[[], AbstractAsyncContextManager[Any]]
)
"""A callable taking the Worker (or no argument) and returning an async context manager (e.g.
an `@contextlib.asynccontextmanager` function): entered before the worker's first reserve,
exited after its last job settled; what it yields is every handler's `ctx.state`."""

LifespanCall = Callable[[Any], AbstractAsyncContextManager[Any]]


def lifespan_call(lifespan: object) -> LifespanCall:
    """How to call `lifespan` with the Worker, checked now rather than when the worker runs:
    a callable of one argument gets the Worker, one of none is called without it. An async
    generator or coroutine function (not an async context manager) raises TypeError, as a
    callable that needs more arguments does."""
    if not callable(lifespan):
        raise ValidationError("lifespan", "must be a callable returning an async context manager")
    name = getattr(lifespan, "__qualname__", type(lifespan).__name__)
    if inspect.isasyncgenfunction(lifespan) or inspect.iscoroutinefunction(lifespan):
        raise TypeError(
            f"the lifespan {name!r} is an async function, not a callable returning an async"
            " context manager: decorate it with @contextlib.asynccontextmanager"
        )
    from .typed_handler import unevaluated_signature

    try:  # only its parameters matter: its annotations may not resolve yet (PEP 649)
        signature = unevaluated_signature(lifespan)
    except (TypeError, ValueError):  # a builtin without a signature: trusted to take the Worker
        return lifespan
    try:
        signature.bind(None)
    except TypeError:
        pass
    else:
        return lifespan
    try:
        signature.bind()
    except TypeError:
        raise TypeError(
            f"the lifespan {name}{signature} cannot be called as lifespan(worker) or lifespan()"
        ) from None

    @functools.wraps(lifespan)  # its name, for lifespan_manager's error
    def without_the_worker(_worker: Any) -> AbstractAsyncContextManager[Any]:
        return lifespan()  # type: ignore[no-any-return]

    return without_the_worker


def lifespan_manager(call: LifespanCall, worker: object) -> AbstractAsyncContextManager[Any]:
    """What `call(worker)` returned, checked to be an async context manager: a coroutine (a
    plain function returning an async function's call) is closed, never left unawaited, and a
    plain context manager refused, each with a TypeError naming the fix."""
    manager: object = call(worker)
    if hasattr(manager, "__aenter__"):
        return manager  # type: ignore[return-value]
    if inspect.iscoroutine(manager):
        manager.close()
    name = getattr(call, "__qualname__", type(call).__name__)
    raise TypeError(
        f"the lifespan {name!r} returned {type(manager).__name__}, not an async context"
        " manager: decorate it with @contextlib.asynccontextmanager"
    )


BackoffSetting = Backoff | Retry
"""A `sepp.Backoff`, or `sepp.Retry.DEFAULT` for the queue's own retry policy."""


class RouteSettings(NamedTuple):
    """How a handler runs, beyond the function: the middleware of the routers it came through
    and of its own registration (outermost first; the Worker adds its own in front); its
    timeout, backoff and failure policy (`retry_on`, `give_up_on`), None where inherited from
    an enclosing router or the Worker; and the `on_dead_letter` hooks of the routers it came
    through (the Worker's first, then from the outermost router in, as for middleware), and
    the limits its jobs pass, gathered the same way (every router's it came through, outermost
    first, then its own registration's)."""

    middleware: tuple[Middleware, ...] = ()
    timeout_s: float | None = None
    backoff: BackoffSetting | None = None
    retry_on: ExceptionTypes | None = None
    give_up_on: ExceptionTypes | None = None
    on_dead_letter: tuple[HookCall, ...] = ()
    limits: tuple[LimitUse, ...] = ()

    def inside(self, outer: RouteSettings) -> RouteSettings:
        """These settings as seen through a router with settings `outer`."""
        return RouteSettings(
            outer.middleware + self.middleware,
            self.timeout_s if self.timeout_s is not None else outer.timeout_s,
            self.backoff if self.backoff is not None else outer.backoff,
            self.retry_on if self.retry_on is not None else outer.retry_on,
            self.give_up_on if self.give_up_on is not None else outer.give_up_on,
            outer.on_dead_letter + self.on_dead_letter,
            outer.limits + self.limits,
        )


NO_SETTINGS = RouteSettings()


class DuplicateHandlerError(SeppError, ValueError):
    """A handler is already registered for `job_type` (None: the catch-all)."""

    def __init__(self, job_type: str | None) -> None:
        what = "a catch-all handler" if job_type is None else f"a handler for {job_type!r}"
        super().__init__(f"{what} is already registered")
        self.job_type = job_type


class Router:
    """Handlers for job types, gathered where no client exists yet (a module of handlers, a
    plugin), then given to a Worker: `sepp.Worker(client, queues, handlers=router)`.

    The registration API is the Worker's: the `handler` and `task` decorators, chainable
    `handle` and `catch_all`. `include` copies another router's handlers into this one. A job
    type registered twice, directly or through `include`, raises DuplicateHandlerError.

    A handler is called as `handler(payload, ctx)`; one that cannot take that raises TypeError
    when registered. If its first parameter is annotated with a model type (a dataclass, a
    pydantic model, ...), the payload is decoded into it first; annotated `sepp.Payload | None`
    (or not at all) it gets the raw payload. A payload that does not decode is dead-lettered at
    once; `on_invalid="retry"` nacks it for a retry instead.

    `middleware` (see `sepp.Middleware`) wraps this router's handlers, also after another
    router includes it, and a registration's own `middleware=` its handler alone, inside;
    `timeout`, `backoff`, `retry_on` and `give_up_on` are defaults for its handlers (a
    handler's own registration, else the nearest router's, else the Worker's; see
    `sepp.Worker` for what the last two mean). `on_dead_letter` (see `sepp.DeadLetterHook`) is
    called for each job of its handlers that the worker's nack dead-lettered, after the
    Worker's own and those of the routers that include this one. `limit` (a `sepp.Limit`, or a
    list of them) is one limit shared by all of this router's handlers together, also after
    another router includes it; each handler's own `limit=` holds besides (both must admit a
    job). Unnamed, it is this router's alone; `name=` makes it the one limit of that name (a
    global one needs a name). `lifespan` (see
    `sepp.Worker`) is the Worker's when this router is handed to it, e.g. by
    `sepp-trio worker`; a router with a lifespan cannot be included in another.
    """

    __slots__ = (
        "_catch_all",
        "_catch_all_settings",
        "_handlers",
        "_on_invalid",
        "_own",
        "_settings",
        "lifespan",
    )

    def __init__(
        self,
        *,
        middleware: Iterable[Middleware] = (),
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
        lifespan: Lifespan | None = None,
        on_invalid: OnInvalid = "dead_letter",
        retry_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        give_up_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        limit: LimitSetting = None,
    ) -> None:
        self._handlers: dict[str, Handler] = {}
        self._on_invalid = check_on_invalid(on_invalid)
        self._catch_all: Handler | None = None
        self._settings: dict[str, RouteSettings] = {}
        self._catch_all_settings = NO_SETTINGS
        self._own = RouteSettings(
            checked_middleware("middleware", middleware),
            optional_timeout(timeout),
            checked_backoff("backoff", backoff),
            checked_exception_types("retry_on", retry_on),
            checked_exception_types("give_up_on", give_up_on),
            checked_hook("on_dead_letter", on_dead_letter),
            checked_limits("limit", limit, router=self),
        )
        if lifespan is not None:
            lifespan_call(lifespan)  # refused now, not when a Worker runs it
        self.lifespan = lifespan

    def handle(
        self,
        job_type: str,
        fn: Callable[[Any, JobContext], Awaitable[object]] | SyncHandler,
        *,
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
        middleware: Iterable[Middleware] = (),
        retry_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        give_up_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        limit: LimitSetting = None,
    ) -> Router:
        """Register `fn` for `job_type`; returns the router so calls chain. `timeout` (seconds
        or timedelta) cancels a handler running longer and nacks its job with the backoff;
        `backoff` paces the retries of its failed jobs; `give_up_on` (exception classes)
        dead-letters a job at once when the handler raises one of them, and `retry_on`, when
        given, retries only those (the rest dead-letter at once). None inherits the router's,
        then the Worker's. `middleware` wraps this handler alone, inside the router's and the
        Worker's (first in the list = outermost). `limit` (a `sepp.Limit`, or a list of them)
        caps how many of its handlers run at once and how often they start, named after
        `job_type` unless it has a name; a job that must wait for it waits without costing an
        attempt (see `sepp.Worker`)."""
        v.utf8_text("job_type", job_type)
        settings = own_settings(
            timeout, backoff, middleware, retry_on, give_up_on, limit, job_type=job_type
        )
        self._register(job_type, fn, settings)
        return self

    def _register(self, job_type: str, fn: Any, settings: RouteSettings) -> None:
        from .typed_handler import prepare

        self._add(job_type, _checked_handler(prepare(fn, job_type, self._on_invalid)), settings)

    def _add(self, job_type: str, fn: Handler, settings: RouteSettings) -> None:
        if job_type in self._handlers:
            raise DuplicateHandlerError(job_type)
        if settings.limits:
            check_one_value_per_name([*limit_uses(self), *settings.limits])
        self._handlers[job_type] = fn
        if settings != NO_SETTINGS:
            self._settings[job_type] = settings

    def task(
        self,
        task: Task[T, R],
        *,
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
        middleware: Iterable[Middleware] = (),
        retry_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        give_up_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        limit: LimitSetting = None,
    ) -> TaskDecorator[T, R]:
        """Decorator: register the handler of `task`'s job type; it gets the payload decoded
        into the task's type: `@router.task(send_welcome)` on
        `async def handle(job: Welcome, ctx: sepp.JobContext)`, or on a `def` handler, which
        runs in a worker thread. `timeout`, `backoff`, `middleware`, `retry_on`, `give_up_on`
        and `limit` as for `handle`."""
        from .._payloads.task import Task
        from .typed_handler import prepare_for_task

        if not isinstance(task, Task):
            raise ValidationError("task", f"must be a sepp.Task, got {type(task).__name__}")
        settings = own_settings(
            timeout, backoff, middleware, retry_on, give_up_on, limit, job_type=task.job_type
        )

        def register(fn: TaskHandler[T, R]) -> TaskHandler[T, R]:
            self._add(task.job_type, _checked_handler(prepare_for_task(fn, task)), settings)
            return fn

        return register  # type: ignore[return-value]  # TaskDecorator's overloads, one body

    def handler(
        self,
        job_type: str,
        *,
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
        middleware: Iterable[Middleware] = (),
        retry_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        give_up_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        limit: LimitSetting = None,
    ) -> Callable[[H], H]:
        """Decorator form of `handle`."""
        v.utf8_text("job_type", job_type)
        # Refused now, not when applied.
        settings = own_settings(
            timeout, backoff, middleware, retry_on, give_up_on, limit, job_type=job_type
        )

        def register(fn: H) -> H:
            self._register(job_type, fn, settings)
            return fn

        return register

    def catch_all(self, fn: H) -> H:
        """Run `fn` for job types without a handler (usable as a decorator). Only one."""
        if self._catch_all is not None:
            raise DuplicateHandlerError(None)
        from .typed_handler import prepare

        self._catch_all = _checked_handler(prepare(fn, None, self._on_invalid))
        return fn

    def include(self, other: Router) -> Router:
        """Copy `other`'s handlers (and catch-all) into this router; returns this router.
        They keep `other`'s middleware, timeout, backoff, failure policy, `on_dead_letter` hook
        and limits. Later registrations on `other` are not seen. On a clash nothing is
        copied."""
        if not isinstance(other, Router):
            raise ValidationError("other", f"must be a sepp.Router, got {type(other).__name__}")
        if other.lifespan is not None:
            raise ValidationError(
                "other",
                "a router with a lifespan cannot be included; give the lifespan to the"
                " router (or Worker) that includes it",
            )
        copy_handlers(self, other)
        return self

    def lookup(self, job_type: str) -> Handler | None:
        """The handler for `job_type`: its own, else the catch-all, else None."""
        return self._handlers.get(job_type, self._catch_all)

    @property
    def job_types(self) -> tuple[str, ...]:
        """The job types with a handler, in registration order."""
        return tuple(self._handlers)

    @property
    def has_catch_all(self) -> bool:
        """Whether a catch-all handler is registered."""
        return self._catch_all is not None

    def __repr__(self) -> str:
        catch_all = " +catch_all" if self._catch_all is not None else ""
        return f"<sepp.Router {list(self._handlers)}{catch_all}>"


# -- how the Worker reads a Router (package-level: Router's public API has no need of it) --------


class RegisteredHandler(NamedTuple):
    """One of a router's handlers as the Worker runs it: `settings` are those of the router and
    of every router it came through (a Worker adds its own)."""

    job_type: str | None  # None: the catch-all
    handler: Handler
    settings: RouteSettings


def registered_handlers(router: Router) -> list[RegisteredHandler]:
    """`router`'s handlers in registration order, then its catch-all (if it has one)."""
    own = router._own
    found = [
        RegisteredHandler(job_type, fn, router._settings.get(job_type, NO_SETTINGS).inside(own))
        for job_type, fn in router._handlers.items()
    ]
    if router._catch_all is not None:
        found.append(
            RegisteredHandler(None, router._catch_all, router._catch_all_settings.inside(own))
        )
    return found


def copy_handlers(into: Router, other: Router) -> None:
    """Copy `other`'s handlers (and catch-all) into `into`, with `other`'s settings; nothing on
    a clash (DuplicateHandlerError). `Router.include`, and the Worker with the router it is
    given (whose lifespan it takes, which `include` refuses)."""
    for job_type in other._handlers:
        if job_type in into._handlers:
            raise DuplicateHandlerError(job_type)
    if other._catch_all is not None and into._catch_all is not None:
        raise DuplicateHandlerError(None)
    check_one_value_per_name([*limit_uses(into), *limit_uses(other)])
    for entry in registered_handlers(other):
        if entry.job_type is None:
            into._catch_all = entry.handler
            into._catch_all_settings = entry.settings
            continue
        into._handlers[entry.job_type] = entry.handler
        if entry.settings != NO_SETTINGS:
            into._settings[entry.job_type] = entry.settings


def own_settings(
    timeout: float | timedelta | None,
    backoff: object,
    middleware: object,
    retry_on: object = None,
    give_up_on: object = None,
    limit: object = None,
    *,
    job_type: str | None = None,
) -> RouteSettings:
    """One registration's own settings, checked (ValidationError); `job_type` names its own
    limit."""
    return RouteSettings(
        checked_middleware("middleware", middleware),
        optional_timeout(timeout),
        checked_backoff("backoff", backoff),
        checked_exception_types("retry_on", retry_on),
        checked_exception_types("give_up_on", give_up_on),
        limits=checked_limits("limit", limit, job_type=job_type),
    )


def limit_uses(router: Router) -> list[LimitUse]:
    """Every limit `router`'s handlers pass (its own, and each registration's)."""
    found = list(router._own.limits) + list(router._catch_all_settings.limits)
    for settings in router._settings.values():
        found += settings.limits
    return found


def optional_timeout(timeout: float | timedelta | None) -> float | None:
    return None if timeout is None else v.seconds("timeout", timeout)


def checked_backoff(field: str, backoff: object) -> BackoffSetting | None:
    if backoff is None or isinstance(backoff, Backoff) or backoff is Retry.DEFAULT:
        return backoff
    raise ValidationError(field, f"must be a sepp.Backoff or sepp.Retry.DEFAULT, got {backoff!r}")


def _checked_handler(fn: Handler | SyncHandler) -> Handler:
    """The handler to run: `fn`, or for a plain `def` function an adapter that runs it in a
    worker thread. (Other callables, e.g. partials or objects with an async __call__, are
    trusted to be async.)"""
    if is_sync_function(fn):
        return run_in_thread(fn)
    if not callable(fn):
        raise ValidationError("handler", f"must be a function, got {type(fn).__name__}")
    return fn  # type: ignore[return-value]
