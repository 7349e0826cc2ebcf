"""Stopping a Worker or a Scheduler: `ShutdownHandle`, which asks from any thread or a signal
handler (the service's `RunHandle` takes the request into its run)."""

from __future__ import annotations

from typing import Protocol


class _Stoppable(Protocol):
    @property
    def is_shutdown(self) -> bool: ...

    def _request_shutdown(self, *, from_task: bool, now: bool = False) -> None: ...


class ShutdownHandle:
    """Asks a Worker or a Scheduler to shut down. `shutdown()` is safe from any thread and from
    a signal handler, before, during or after `run()`."""

    __slots__ = ("_target",)

    def __init__(self, target: _Stoppable) -> None:
        self._target = target

    def shutdown(self, *, now: bool = False) -> None:
        """Ask for a graceful shutdown (idempotent). `now=True` does not wait for a Worker's
        running handlers: they are cancelled and their jobs returned, as when the worker's
        `shutdown_timeout` passes. A Scheduler always stops at once."""
        self._target._request_shutdown(from_task=False, now=now)

    @property
    def is_shutdown(self) -> bool:
        """Whether shutdown was requested."""
        return self._target.is_shutdown

    def __repr__(self) -> str:
        return f"<sepp.ShutdownHandle of {self._target!r}>"
