"""Which client a service was given: the Worker, the Scheduler and `OutboxRelay.run` await
the async `sepp.Client`, and `OutboxRelay.run_sync` blocks on a `sepp.SyncClient`. Handed the
other kind, they would block the event loop, or make coroutines nothing awaits; they refuse it
before anything is sent."""

from __future__ import annotations

import sys

from .._model.errors import ValidationError


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
