"""What `sepp.open()` returns: an async context manager that says how to use it when it is
mistaken for a client, awaited, or entered outside an async run. The runtime is picked as it
is entered, from the library running the caller (`_runtime.running`): trio, or asyncio (and
uvloop), whose runtime is imported only then."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, NoReturn, TypeVar

from .._runtime.protocol import Runtime
from .._runtime.running import current_runtime

T = TypeVar("T")

USE = "use `async with sepp.open(...) as client:`"


class Opening(AbstractAsyncContextManager[T]):
    """`async with` it to get a connected Client; the connection closes when the block exits."""

    __slots__ = ("_cm", "_open")

    def __init__(self, open_on: Callable[[Runtime], AbstractAsyncContextManager[T]]) -> None:
        self._open = open_on
        self._cm: AbstractAsyncContextManager[T] | None = None

    async def __aenter__(self) -> T:
        if self._cm is not None:
            raise RuntimeError(f"this sepp.open() was entered already: {USE} once per client")
        runtime = current_runtime("sepp.open()")
        self._cm = self._open(runtime)
        return await self._cm.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._cm is not None, "__aexit__ without __aenter__"
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
