"""The monitor's HTTP responder under asyncio: the same requests and answers as on trio
(`http_responder`), on anyio's TCP listeners and streams."""

from __future__ import annotations

import anyio
import anyio.abc

from .._runtime.concurrency import TaskStatus
from .http_responder import WRITE_TIMEOUT_S, Responder, read_head, render


async def serve(
    responder: Responder,
    port: int,
    *,
    host: str | None,
    task_status: TaskStatus[int],  # or anyio's, from a task group's start()
) -> None:
    """Listen on `host:port` (None: every interface; 0: any free port) until cancelled."""
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as connections:
        task_status.started(bound)
        await listener.serve(lambda stream: handle(responder, stream), connections)


async def handle(responder: Responder, stream: anyio.abc.ByteStream) -> None:
    """One connection: one request, one response, close. Never raises."""

    async def receive_some(max_bytes: int) -> bytes:
        try:
            return await stream.receive(max_bytes)
        except anyio.EndOfStream:
            return b""

    try:
        if not responder.take_slot():
            return  # too many at once: close without reading
        try:
            head = await read_head(receive_some, anyio.move_on_after)
            status, content_type, body = (
                head if isinstance(head, tuple) else responder.respond(head)
            )
            with anyio.move_on_after(WRITE_TIMEOUT_S):
                await stream.send(render(status, content_type, body))
        finally:
            responder.release_slot()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass  # the client went away
    finally:
        await anyio.aclose_forcefully(stream)
