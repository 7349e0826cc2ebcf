"""Local checks of jobs against the server's advertised (global) limits, so a job the server
would reject costs no round trip, and the cache those limits are kept in. The server keeps the
final word: per-queue overrides are not advertised."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .._model.types import EnqueueRequest, ServerInfo
from .._runtime.protocol import EventLike, Runtime, TaskGroup
from .._runtime.wall_clock import utc_now
from .._util.lazy import lazy_module
from .._util.log import Log

if TYPE_CHECKING:
    from .._model import rejection_reasons as rj
else:  # the rejection classes load with the first rejection
    rj = lazy_module("sepp._model.rejection_reasons")

# Refetch at most this often: after a rejection that contradicts the cache, or a failed fetch.
LIMITS_REFRESH_S = 30.0

# Only reject a schedule this far past the estimated horizon: the server's clock is estimated.
_SCHEDULE_SLACK = timedelta(seconds=2)


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def custom_map_bytes(request: EnqueueRequest) -> int:
    """Key bytes plus value bytes; an int or double counts 8 and a bool 1 (server rule)."""
    total = 0
    for key, value in request.custom.items():
        total += _utf8_len(key)
        if isinstance(value, bool):
            total += 1
        elif isinstance(value, (int, float)):
            total += 8
        else:
            total += _utf8_len(value)
    return total


class ServerLimits:
    """A cached ServerInfo and the local clock reading taken when it was fetched."""

    __slots__ = ("fetched_at", "info", "names_within")

    def __init__(self, info: ServerInfo, fetched_at: datetime) -> None:
        self.info = info
        self.fetched_at = fetched_at
        # (queue, job_type) pairs found within the name limits: a batch repeats them.
        self.names_within: set[tuple[str, str]] = set()

    def server_now(self) -> datetime:
        return self.info.server_time + (utc_now() - self.fetched_at)

    def check(self, request: EnqueueRequest) -> rj.JobRejection | None:
        info = self.info
        names = (request.queue, request.job_type)
        if names not in self.names_within:
            size = _utf8_len(request.queue)
            if info.max_queue_name_bytes and size > info.max_queue_name_bytes:
                return rj.QueueNameTooLong(info.max_queue_name_bytes, size)
            size = _utf8_len(request.job_type)
            if info.max_job_type_bytes and size > info.max_job_type_bytes:
                return rj.JobTypeNameTooLong(info.max_job_type_bytes, size)
            if len(self.names_within) >= 256:
                self.names_within.clear()
            self.names_within.add(names)
        if request.idempotency_key is not None:
            size = _utf8_len(request.idempotency_key)
            if info.max_idempotency_key_bytes and size > info.max_idempotency_key_bytes:
                return rj.IdempotencyKeyTooLong(info.max_idempotency_key_bytes, size)
        payload = request.payload
        if payload is not None:
            if info.max_payload_bytes and len(payload.data) > info.max_payload_bytes:
                return rj.PayloadTooLarge(info.max_payload_bytes, len(payload.data))
            if info.restricts_encodings and payload.encoding not in info.allowed_encodings:
                return rj.EncodingNotAllowed(payload.encoding, info.allowed_encodings)
        if request.custom:
            if info.max_custom_entries and len(request.custom) > info.max_custom_entries:
                return rj.CustomEntriesTooMany(info.max_custom_entries, len(request.custom))
            for key in request.custom:
                size = _utf8_len(key)
                if info.max_custom_key_bytes and size > info.max_custom_key_bytes:
                    return rj.CustomKeyTooLong(key, info.max_custom_key_bytes, size)
            size = custom_map_bytes(request)
            if info.max_custom_total_bytes and size > info.max_custom_total_bytes:
                return rj.CustomMapTooLarge(info.max_custom_total_bytes, size)
        if request.scheduled_at is not None and info.max_schedule_horizon:
            latest = self.server_now() + info.max_schedule_horizon + _SCHEDULE_SLACK
            if request.scheduled_at > latest:
                return rj.ScheduledTooFar(info.max_schedule_horizon, request.scheduled_at)
        return None

    def check_all(self, requests: Sequence[EnqueueRequest]) -> list[rj.JobRejection | None]:
        """`check` for each job, in order; a job with nothing but names seen before and a
        payload is checked inline (a batch's jobs mostly are)."""
        info = self.info
        names_within = self.names_within
        most = info.max_payload_bytes or math.inf
        free_encodings = not info.restricts_encodings
        out: list[rj.JobRejection | None] = []
        append = out.append
        check = self.check
        for request in requests:
            payload = request.payload
            if (
                payload is not None
                and free_encodings
                and request.idempotency_key is None
                and not request.custom
                and request.scheduled_at is None
                and len(payload.data) <= most
                and (request.queue, request.job_type) in names_within
            ):
                append(None)
            else:
                append(check(request))
        return out

    def contradicted_by(self, rejection: rj.JobRejection) -> bool:
        """A deterministic server rejection naming a different global limit than ours: the
        config may have been hot-reloaded, so the cache should be refreshed."""
        info = self.info
        limits = {
            rj.QueueNameTooLong: info.max_queue_name_bytes,
            rj.JobTypeNameTooLong: info.max_job_type_bytes,
            rj.IdempotencyKeyTooLong: info.max_idempotency_key_bytes,
        }
        expected = limits.get(type(rejection))
        return expected is not None and getattr(rejection, "limit", expected) != expected


class LimitsCache:
    """The server's limits for local checks, never in a call's way.

    `start()` fetches them in the background as soon as the connection is up. A call waits
    for a fetch in flight at most half of its remaining time, so it keeps the other half to
    send; past that it goes on without local checks (the server checks anyway). A rejection
    that contradicts the cache, or a failed fetch, schedules the next fetch at most every
    30 s. Nothing here raises: without limits the server checks alone.
    """

    def __init__(
        self,
        fetch: Callable[[float | None], Awaitable[ServerInfo]],
        log: Log,
        runtime: Runtime,
    ) -> None:
        self._fetch_info = fetch  # given a timeout in seconds (None: the client's own)
        self._log = log
        self._rt = runtime
        self.limits: ServerLimits | None = None
        self._fetched_at = -math.inf
        self._stale_at = -math.inf  # the runtime's time from which the cache is refetched
        self._fetching: EventLike | None = None  # set when the fetch in flight ends
        self._nursery: TaskGroup | None = None

    def start(self, nursery: TaskGroup) -> None:
        """Fetch now, in the background; later fetches also run in `nursery`."""
        self._nursery = nursery
        self._begin_fetch()

    def update(self, info: ServerInfo) -> None:
        """Every ServerInfo the client receives refreshes the cache."""
        self.limits = ServerLimits(info, utc_now())
        self._fetched_at = self._rt.current_time()
        self._stale_at = math.inf

    @property
    def fresh(self) -> bool:
        """Whether `limits` can be used now, without waiting for (or starting) a fetch."""
        stale_at = self._stale_at
        return self._fetching is None and (
            stale_at == math.inf or self._rt.current_time() < stale_at
        )

    async def current(self, deadline: float) -> ServerLimits | None:
        """The limits for a call that must be done by `deadline` (the runtime's time; a trio
        caller's cancel scopes count too)."""
        rt = self._rt
        done = self._fetching
        fetch_here = False
        if done is None:
            if rt.current_time() < self._stale_at:
                return self.limits
            done = self._begin_fetch()
            fetch_here = self._nursery is None  # no nursery to fetch in: this call does it
        now = rt.current_time()
        deadline = min(deadline, rt.effective_deadline())
        until = now + (deadline - now) / 2
        if fetch_here:
            fetching = done

            async def fetch(timeout_s: float | None) -> None:
                await self._fetch(fetching, timeout_s)

            await rt.bounded(fetch, until)
        else:
            await rt.wait_event(done, until)
        return self.limits

    def note_rejections(self, rejections: Sequence[rj.JobRejection]) -> None:
        limits = self.limits
        if limits is not None and any(limits.contradicted_by(r) for r in rejections):
            # Refetch on the next enqueue, but never more than once per refresh interval.
            self._stale_at = min(self._stale_at, self._fetched_at + LIMITS_REFRESH_S)

    def _begin_fetch(self) -> EventLike:
        done = self._fetching = self._rt.event()
        if self._nursery is not None:
            try:
                self._nursery.start_soon(self._fetch, done, name="sepp.limits_fetch")
            except RuntimeError:  # the client is closing: its calls fail anyway
                self._fetching = None
                done.set()
        return done

    async def _fetch(self, done: EventLike, timeout_s: float | None = None) -> None:
        try:
            await self._fetch_info(timeout_s)  # the client hands every ServerInfo to update()
        except Exception as exc:
            self._stale_at = self._rt.current_time() + LIMITS_REFRESH_S
            self._log.debug("sepp: cannot fetch server limits for local checks: %s", exc)
        finally:
            if self._fetching is done:
                self._fetching = None
            done.set()
