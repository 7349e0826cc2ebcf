"""Which client a call was given: the Worker, the Scheduler and `OutboxRelay.run` await
the async `sepp.Client`, and `OutboxRelay.run_sync` blocks on a `sepp.SyncClient`. Handed the
other kind, they would block the event loop, or make coroutines nothing awaits; they refuse it
before anything is sent. A task's `enqueue`, `submit` and the like take either, and nothing
else."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .._model.errors import ValidationError

if TYPE_CHECKING:
    from .client import Client
    from .sync import SyncClient


def refuse_a_blocking_client(client: object, where: str) -> None:
    """ValidationError if `client` is a `sepp.SyncClient` (it can be one only once its module
    is loaded: nothing is imported here)."""
    sync = sys.modules.get("sepp._client.sync")
    if sync is not None and isinstance(client, sync.SyncClient):
        raise ValidationError(
            "client",
            f"{where} awaits the async sepp.Client (`async with sepp.open(...) as client:`),"
            " not a sepp.SyncClient, whose calls would block the event loop",
        )


def refuse_an_async_client(client: object, where: str) -> None:
    """ValidationError if `client` is the async `sepp.Client`."""
    from .client import Client

    if isinstance(client, Client):
        raise ValidationError(
            "client",
            f"{where} blocks on a sepp.SyncClient; with the async sepp.Client its calls would"
            " be coroutines nothing awaits",
        )


def either_client(client: object, what: str, advice: str = "") -> Client | SyncClient:
    """`client`, a `sepp.Client` or a `sepp.SyncClient`; TypeError (before anything is sent)
    for anything else, its message ending with `advice`."""
    from .client import Client
    from .sync import SyncClient

    if not isinstance(client, Client | SyncClient):
        raise TypeError(
            f"{what} takes a sepp.Client (await the result) or a sepp.SyncClient, not a"
            f" {type(client).__qualname__}{advice}"
        )
    return client
