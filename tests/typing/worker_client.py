"""A Worker takes any client with reserve, ack, nack and extend (checked by test_typing.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import sepp


class FourMethods:
    """All a Worker calls, with sepp.Client's signatures."""

    async def reserve(
        self,
        queues: Sequence[str] | str,
        *,
        lease_duration: float | timedelta = 30.0,
        wait_timeout: float | timedelta = 20.0,
        max_jobs: int | None = None,
        worker_id: str | None = None,
    ) -> list[sepp.Job] | None:
        return None

    async def ack(self, ctx: sepp.JobContext, *, timeout: float | timedelta | None = None) -> None:
        return None

    async def nack(
        self,
        ctx: sepp.JobContext,
        *,
        reason: str | None = None,
        retry: sepp.Retry = sepp.Retry.DEFAULT,
        timeout: float | timedelta | None = None,
    ) -> bool:
        return False

    async def extend(
        self,
        ctx: sepp.JobContext,
        lease_duration: float | timedelta,
        *,
        timeout: float | timedelta | None = None,
    ) -> datetime:
        return ctx.lease_expires_at


class NoExtend:
    async def reserve(self, queues: Sequence[str] | str) -> list[sepp.Job] | None:
        return None


async def build(client: sepp.Client) -> None:
    sepp.Worker(client, ["q"])
    sepp.Worker(FourMethods(), ["q"])
    sepp.Worker(NoExtend(), ["q"])  # type: ignore[arg-type]
