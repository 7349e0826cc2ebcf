"""The client calls a global limit makes: `sepp.Client` has them, and so can a test fake."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from .._model.rejections import JobRejection
from .._model.types import EnqueueAck, EnqueueRequest, Job, JobContext, Retry, ServerInfo


class LeaseClient(Protocol):
    """`reserve`, `ack`, `nack` and `extend`, with `sepp.Client`'s signatures: the calls
    that hold a job (the Worker's are these, too)."""

    async def reserve(
        self,
        queues: Sequence[str] | str,
        *,
        lease_duration: float | timedelta = ...,
        wait_timeout: float | timedelta = ...,
        max_jobs: int | None = ...,
        worker_id: str | None = ...,
    ) -> list[Job] | None: ...

    async def ack(self, ctx: JobContext, *, timeout: float | timedelta | None = ...) -> None: ...

    async def nack(
        self,
        ctx: JobContext,
        *,
        reason: str | None = ...,
        retry: Retry = ...,
        timeout: float | timedelta | None = ...,
    ) -> bool: ...

    async def extend(
        self,
        ctx: JobContext,
        lease_duration: float | timedelta,
        *,
        timeout: float | timedelta | None = ...,
    ) -> datetime: ...


class LimitClient(LeaseClient, Protocol):
    """A lease's calls plus `enqueue_batch` and `get_server_info`: permits are jobs, and
    nothing else is needed."""

    async def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest], *, timeout: float | timedelta | None = ...
    ) -> list[EnqueueAck | JobRejection]: ...

    async def get_server_info(self, *, timeout: float | timedelta | None = ...) -> ServerInfo: ...
