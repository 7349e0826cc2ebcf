"""What `sepp.open()` returns: an async context manager that says how to use it when it is
mistaken for a client, awaited, or entered outside trio."""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import trio

T = TypeVar("T")

USE = "use `async with sepp.open(...) as client:`"


class Opening(AbstractAsyncContextManager[T]):
    """`async with` it to get a connected Client; the connection closes when the block exits."""

    __slots__ = ("_cm",)

    def __init__(self, cm: AbstractAsyncContextManager[T]) -> None:
        self._cm = cm

    async def __aenter__(self) -> T:
        require_trio("sepp.open()")
        return await self._cm.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._cm.__aexit__(exc_type, exc, tb)

    def __getattr__(self, name: str) -> NoReturn:
        # Only for names the object lacks: `client = sepp.open(...); client.enqueue(...)`.
        raise AttributeError(
            f"sepp.open() returns an async context manager, not a Client, so it has no"
            f" {name!r}: {USE}"
        )

    def __await__(self) -> Any:
        raise TypeError(f"sepp.open() is not awaitable: {USE}")

    def __enter__(self) -> NoReturn:
        raise TypeError(f"sepp.open() is an async context manager: {USE}")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ always raises
        return None

    def __repr__(self) -> str:
        return "<sepp.open() context manager; " + USE + ">"


def require_trio(what: str) -> None:
    """Raise a RuntimeError saying what to do when not running under trio (under asyncio,
    trio's own error is an AttributeError about its internals)."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        pass
    else:
        return
    if _asyncio_running():
        raise RuntimeError(
            f"{what} was called under asyncio, but sepp-trio runs on trio: run the code with"
            " trio.run(), call it from asyncio through trio-asyncio, or use the blocking client"
            " sepp.SyncClient (from a thread)"
        )
    raise RuntimeError(f"{what} must be called from trio (inside trio.run())")


def _asyncio_running() -> bool:
    asyncio = sys.modules.get("asyncio")  # never imported here: if absent, it is not running
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
