"""A Worker takes any client with reserve, ack, nack and extend (checked by test_typing.py)."""

from __future__ import annotations

from collections.abc import Sequence

from fixtures.fake_client import FakeClient

import sepp


class NoExtend:
    async def reserve(self, queues: Sequence[str] | str) -> list[sepp.Job] | None:
        return None


async def build(client: sepp.Client) -> None:
    sepp.Worker(client, ["q"])
    sepp.Worker(FakeClient(), ["q"])  # the four methods with sepp.Client's signatures
    sepp.Worker(NoExtend(), ["q"])  # type: ignore[arg-type]
