"""The calls of `sepp.Client` that the layers above hold a client by, as protocols with its
signatures: a test fake can stand in for the client, and so can a `SyncClient`'s calls as
coroutines that never suspend (`sync.BlockingCalls`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from .._model.types import EnqueueAck, EnqueueRequest, Job, JobContext, Retry


class LeaseClient(Protocol):
    """`reserve`, `ack`, `nack` and `extend`: the calls that hold a job (a Worker's, a global
    limit's permits')."""

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


class JobsClient(LeaseClient, Protocol):
    """A lease's calls plus `enqueue` and `enqueue_atomic`: what jobs that lead to jobs take
    (a submission, the reply listener, a worker's follow-ups and replies)."""

    async def enqueue(
        self, request: EnqueueRequest, /, *, timeout: float | timedelta | None = ...
    ) -> EnqueueAck: ...

    async def enqueue_atomic(
        self, jobs: Iterable[EnqueueRequest], *, timeout: float | timedelta | None = ...
    ) -> list[EnqueueAck]: ...
