"""What a Worker tells whoever watches it, as it happens: the `WorkerEvents` protocol. The
`WorkerMonitor` counts them (`monitor.feed_of`); the Worker knows nothing else about it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from .._model.types import JobContext


class LimitCounts(NamedTuple):
    """One `sepp.Limit` in a Worker, as its metrics show it: how many of its handlers run and
    how many held jobs wait for it now; how many it admitted, deferred and lost a permit of so
    far, and the admitted jobs' waits summed (seconds); the keys it keeps state for."""

    label: str
    scope: str
    running: int
    waiting: int
    admitted: int
    deferred: int
    lost: int
    waited_s: float
    keys: int


class WorkerEvents(Protocol):
    def worker_started(self, job_types: Iterable[str]) -> None:
        """`run()` began; `job_types` have a handler of their own."""

    def reserving(self) -> None:
        """The first reserve is being sent (or the worker stopped before it was)."""

    def shutting_down(self) -> None: ...

    def paused(self) -> None:
        """`pause()` took effect: no reserve is pending, none is sent until `resumed`."""

    def resumed(self) -> None:
        """`resume()`: the worker reserves again."""

    def stopped(self) -> None:
        """`run()` ended."""

    def reserve_done(self, duration_s: float, error: BaseException | None) -> None:
        """A reserve returned (`error` None) or failed after `duration_s`."""

    def job_started(self, ctx: JobContext) -> None:
        """The job's handler (with its middleware) starts."""

    def job_ended(self, ctx: JobContext, duration_s: float) -> None:
        """The handler that started ran for `duration_s` and ended, however it did."""

    def job_settled(self, ctx: JobContext, label: str | None, dead_lettered: bool | None) -> None:
        """The job is done here: `label` is its outcome's ("ack", "error", ...; None: the
        lease was lost), `dead_lettered` the nack's answer (None: no nack, or it failed)."""

    def limit_changed(self, counts: LimitCounts) -> None:
        """A limit's counts changed (or it was made: the Worker's limits are told first)."""
