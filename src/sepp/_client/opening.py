"""What `sepp.open()` returns: an async context manager that says how to use it when it is
mistaken for a client, awaited, or entered outside its runtime (trio)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, NoReturn, TypeVar

from .runtime import Runtime

T = TypeVar("T")

USE = "use `async with sepp.open(...) as client:`"


class Opening(AbstractAsyncContextManager[T]):
    """`async with` it to get a connected Client; the connection closes when the block exits."""

    __slots__ = ("_cm", "_runtime")

    def __init__(self, cm: AbstractAsyncContextManager[T], runtime: Runtime) -> None:
        self._cm = cm
        self._runtime = runtime

    async def __aenter__(self) -> T:
        self._runtime.check_running("sepp.open()")
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
