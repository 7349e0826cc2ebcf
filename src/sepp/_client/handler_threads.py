"""The threads a Worker runs `def` handlers in, as the async `Client` sees them. There nothing
awaits: a call of the async client would make a coroutine that never runs (the job acked, its
follow-up gone, a RuntimeWarning the only trace), so those calls raise at once instead. A `def`
handler's `ctx.client` is a blocking client whose calls run in the worker's own run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import MethodType
from typing import Any

from .._model.errors import OtherRunError


class _HandlerThread(threading.local):
    active = False  # True while a `def` handler runs in this thread (the Worker sets it)


HANDLER_THREAD = _HandlerThread()


class _RefusedInHandlerThreads:
    """A method of the async client, as a descriptor: looked up on a client in a `def`
    handler's thread, where that client's run is not running, it raises; anywhere else it is
    the method itself (`inspect.iscoroutinefunction` holds). A lookup on the class gives the
    plain function (what SyncClient wraps)."""

    __slots__ = ("_fn", "_name")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self._name = fn.__name__

    def __get__(self, client: Any, owner: type | None = None) -> Any:
        if client is None:
            return self._fn
        if HANDLER_THREAD.active:
            root = client._root_task
            if root is not None and client._rt.owner() is not root:
                raise in_a_handler_thread(f"sepp.Client.{self._name}")
        return MethodType(self._fn, client)


def refuse_in_handler_threads(cls: type, names: tuple[str, ...]) -> None:
    """Make `cls`'s methods `names` raise when looked up in a `def` handler's thread."""
    for name in names:
        setattr(cls, name, _RefusedInHandlerThreads(vars(cls)[name]))


def in_a_handler_thread(what: str) -> OtherRunError:
    return OtherRunError(
        f"{what} was called in a `def` handler's thread, where nothing awaits its coroutine:"
        " the call would never run. Use ctx.client there (a blocking client whose calls run"
        " in the worker's event loop), or make the handler `async def`"
    )
