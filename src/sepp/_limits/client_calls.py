"""The client calls a global limit makes: `sepp.Client` has them, and so can a test fake."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Protocol

from .._client.calls import LeaseClient
from .._model.rejections import JobRejection
from .._model.types import EnqueueAck, EnqueueRequest, ServerInfo


class LimitClient(LeaseClient, Protocol):
    """A lease's calls plus `enqueue_batch` and `get_server_info`: permits are jobs, and
    nothing else is needed."""

    async def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest], *, timeout: float | timedelta | None = ...
    ) -> list[EnqueueAck | JobRejection]: ...

    async def get_server_info(self, *, timeout: float | timedelta | None = ...) -> ServerInfo: ...
