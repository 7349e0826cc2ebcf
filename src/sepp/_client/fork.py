"""Which process an object belongs to, checked cheaply on every call: after `fork()` the child
must never touch a connection it inherited (the parent still owns that socket)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .._model.errors import ClientError

_generation = 0  # bumped in every child process fork() makes


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


@dataclass(frozen=True, slots=True)
class Origin:
    """The process (and fork generation) an object was made in."""

    generation: int
    pid: int

    @property
    def forked(self) -> bool:
        """Whether this process is a fork() child of the one the object was made in."""
        return self.generation != _generation


def here() -> Origin:
    return Origin(_generation, os.getpid())


def check_not_forked(origin: Origin, what: str, hint: str) -> None:
    """Raise ClientError if `origin` is another process than this one."""
    if origin.generation != _generation:
        raise ClientError(
            f"this {what} was opened in process {origin.pid} and cannot be used after fork()"
            f" in process {os.getpid()}: its connection belongs to the parent. {hint}"
        )
