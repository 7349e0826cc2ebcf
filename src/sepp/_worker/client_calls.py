"""The client calls a Worker makes: `sepp.Client` has them, and so can a test fake."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from .._model.types import Job, JobContext, Retry


class WorkerClient(Protocol):
    """`reserve`, `ack`, `nack` and `extend`, with `sepp.Client`'s signatures."""

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
