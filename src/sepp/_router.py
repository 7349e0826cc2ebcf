"""Router: the registry of job handlers. A Worker keeps one; users build their own without a
client and hand it to a Worker later."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from . import _validate as v
from ._errors import SeppError, ValidationError
from ._outcomes import OnInvalid, check_on_invalid
from ._types import JobContext, Payload

if TYPE_CHECKING:
    from ._task import Task

Handler = Callable[[Payload | None, JobContext], Awaitable[None]]
"""An async function `(payload, ctx) -> None` that processes one job."""

H = TypeVar("H", bound=Callable[[Any, JobContext], Awaitable[None]])
T = TypeVar("T")


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
    once; `on_invalid="retry"` nacks it for the queue's retry policy instead.
    """

    __slots__ = ("_catch_all", "_handlers", "_on_invalid")

    def __init__(self, *, on_invalid: OnInvalid = "dead_letter") -> None:
        self._handlers: dict[str, Handler] = {}
        self._catch_all: Handler | None = None
        self._on_invalid = check_on_invalid(on_invalid)

    def handle(self, job_type: str, fn: Callable[[Any, JobContext], Awaitable[None]]) -> Router:
        """Register `fn` for `job_type`; returns the router so calls chain."""
        v.utf8_text("job_type", job_type)
        _check_handler(fn)
        from ._typed_handler import prepare

        self._add(job_type, prepare(fn, job_type, self._on_invalid))
        return self

    def _add(self, job_type: str, fn: Handler) -> None:
        if job_type in self._handlers:
            raise DuplicateHandlerError(job_type)
        self._handlers[job_type] = fn

    def task(
        self, task: Task[T]
    ) -> Callable[
        [Callable[[T, JobContext], Awaitable[None]]], Callable[[T, JobContext], Awaitable[None]]
    ]:
        """Decorator: register the handler of `task`'s job type; it gets the payload decoded
        into the task's type: `@router.task(send_welcome)` on
        `async def handle(job: Welcome, ctx: sepp.JobContext)`."""
        from ._task import Task
        from ._typed_handler import prepare_for_task

        if not isinstance(task, Task):
            raise ValidationError("task", f"must be a sepp.Task, got {type(task).__name__}")

        def register(
            fn: Callable[[T, JobContext], Awaitable[None]],
        ) -> Callable[[T, JobContext], Awaitable[None]]:
            _check_handler(fn)
            self._add(task.job_type, prepare_for_task(fn, task))
            return fn

        return register

    def handler(self, job_type: str) -> Callable[[H], H]:
        """Decorator form of `handle`."""
        v.utf8_text("job_type", job_type)

        def register(fn: H) -> H:
            self.handle(job_type, fn)
            return fn

        return register

    def catch_all(self, fn: H) -> H:
        """Run `fn` for job types without a handler (usable as a decorator). Only one."""
        _check_handler(fn)
        if self._catch_all is not None:
            raise DuplicateHandlerError(None)
        from ._typed_handler import prepare

        self._catch_all = prepare(fn, None, self._on_invalid)
        return fn

    def include(self, other: Router) -> Router:
        """Copy `other`'s handlers (and catch-all) into this router; returns this router.
        Later registrations on `other` are not seen. On a clash nothing is copied."""
        if not isinstance(other, Router):
            raise ValidationError("other", f"must be a sepp.Router, got {type(other).__name__}")
        for job_type in other._handlers:
            if job_type in self._handlers:
                raise DuplicateHandlerError(job_type)
        if other._catch_all is not None and self._catch_all is not None:
            raise DuplicateHandlerError(None)
        self._handlers.update(other._handlers)
        if other._catch_all is not None:
            self._catch_all = other._catch_all
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


def _check_handler(fn: object) -> None:
    # A plain `def` would only fail at the first job; refuse it now. (Other callables, e.g.
    # partials or objects with an async __call__, are trusted.)
    if inspect.isfunction(fn) and not inspect.iscoroutinefunction(fn):
        raise ValidationError("handler", f"{fn.__qualname__} must be `async def`")
    if not callable(fn):
        raise ValidationError("handler", f"must be an async function, got {type(fn).__name__}")
