"""What a limiter hands a job it admits, and what it reports: `Admission` (held while the
handler runs, released after; a global one can be lost) and `LimitStats` (per limit and key:
how many run, how many wait)."""

from __future__ import annotations

from collections.abc import Callable

from .._model.limit_stats import LimitStats as LimitStats

LostCallback = Callable[[str], None]


class Admission:
    """A job's admission through one limit: `release()` once its handler is done (idempotent;
    a global permit's release is sent in the background). A global permit can be lost while
    held (its lease could not be kept): the callbacks given to `on_lost` are called once, with
    why, and the holder must stop its handler (fencing by cancellation)."""

    __slots__ = ("_lost_callbacks", "_on_release", "key", "lost", "released", "waited_s")

    def __init__(
        self, key: str, on_release: Callable[[Admission], None], waited_s: float = 0.0
    ) -> None:
        self.key = key
        self.waited_s = waited_s
        self.released = False
        self.lost: str | None = None
        self._on_release = on_release
        self._lost_callbacks: list[LostCallback] = []

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._on_release(self)

    def on_lost(self, callback: LostCallback) -> None:
        """Call `callback(why)` when the admission is lost (at once if it already is)."""
        if self.lost is not None:
            callback(self.lost)
        else:
            self._lost_callbacks.append(callback)

    def lose(self, why: str) -> None:
        """The limiter's side: the permit behind this admission is gone."""
        if self.lost is not None or self.released:
            return
        self.lost = why
        callbacks, self._lost_callbacks = self._lost_callbacks, []
        for callback in callbacks:
            callback(why)

    def __repr__(self) -> str:
        state = "released" if self.released else "lost" if self.lost else "held"
        return f"<sepp limit admission {self.key!r} {state}>"


class Admissions:
    """Several admissions held as one (a limit's concurrency permit and its rate token, or a
    handler's limits together): released together, lost when any is."""

    __slots__ = ("_parts", "_whole")

    def __init__(self, key: str, parts: list[Admission], waited_s: float) -> None:
        self._parts = parts
        self._whole = Admission(key, self._release_parts, waited_s)
        for part in parts:
            part.on_lost(self._whole.lose)

    @property
    def admission(self) -> Admission:
        return self._whole

    def _release_parts(self, _: Admission) -> None:
        for part in self._parts:
            part.release()
