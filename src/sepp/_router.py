"""Router: the registry of job handlers. A Worker keeps one; users build their own without a
client and hand it to a Worker later."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from . import _validate as v
from ._errors import SeppError, ValidationError
from ._thread_handlers import SyncHandler, is_sync_function, run_in_thread
from ._types import JobContext, Payload

Handler = Callable[[Payload | None, JobContext], Awaitable[None]]
"""An async function `(payload, ctx) -> None` that processes one job. A plain `def` function
is accepted too: it runs in a worker thread (see "Synchronous code" in the docs)."""

H = TypeVar("H", bound=Handler | SyncHandler)


class DuplicateHandlerError(SeppError, ValueError):
    """A handler is already registered for `job_type` (None: the catch-all)."""

    def __init__(self, job_type: str | None) -> None:
        what = "a catch-all handler" if job_type is None else f"a handler for {job_type!r}"
        super().__init__(f"{what} is already registered")
        self.job_type = job_type


class Router:
    """Handlers for job types, gathered where no client exists yet (a module of handlers, a
    plugin), then given to a Worker: `sepp.Worker(client, queues, handlers=router)`.

    The registration API is the Worker's: the `handler` decorator, chainable `handle` and
    `catch_all`. `include` copies another router's handlers into this one. A job type
    registered twice, directly or through `include`, raises DuplicateHandlerError.
    """

    __slots__ = ("_catch_all", "_handlers")

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._catch_all: Handler | None = None

    def handle(self, job_type: str, fn: Handler | SyncHandler) -> Router:
        """Register `fn` for `job_type`; returns the router so calls chain."""
        v.utf8_text("job_type", job_type)
        handler = _checked_handler(fn)
        if job_type in self._handlers:
            raise DuplicateHandlerError(job_type)
        self._handlers[job_type] = handler
        return self

    def handler(self, job_type: str) -> Callable[[H], H]:
        """Decorator form of `handle`."""
        v.utf8_text("job_type", job_type)

        def register(fn: H) -> H:
            self.handle(job_type, fn)
            return fn

        return register

    def catch_all(self, fn: H) -> H:
        """Run `fn` for job types without a handler (usable as a decorator). Only one."""
        handler = _checked_handler(fn)
        if self._catch_all is not None:
            raise DuplicateHandlerError(None)
        self._catch_all = handler
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


def _checked_handler(fn: Handler | SyncHandler) -> Handler:
    """The handler to run: `fn`, or for a plain `def` function an adapter that runs it in a
    worker thread. (Other callables, e.g. partials or objects with an async __call__, are
    trusted to be async.)"""
    if is_sync_function(fn):
        return run_in_thread(fn)  # type: ignore[arg-type]
    if not callable(fn):
        raise ValidationError("handler", f"must be a function, got {type(fn).__name__}")
    return fn  # type: ignore[return-value]
