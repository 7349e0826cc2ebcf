"""The client calls a Worker makes: `sepp.Client` has them, and so can a test fake."""

from __future__ import annotations

from typing import Protocol

from .._client.calls import LeaseClient


class WorkerClient(LeaseClient, Protocol):
    """`reserve`, `ack`, `nack` and `extend`, with `sepp.Client`'s signatures."""
