"""A FastAPI app that enqueues from its endpoints and runs a sepp Worker in the same process.

The lifespan opens one client for the whole app, starts the worker in a task beside the
server and, at shutdown, lets it finish the jobs it holds before the client closes:

    SEPP_ADDR=127.0.0.1:50051 uvicorn fastapi_app:app        # or: --loop uvloop

Needs `pip install 'sepp-trio[asyncio]' fastapi uvicorn`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

import sepp

router = sepp.Router()


@router.handler("send_welcome")
async def send_welcome(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
    assert payload is not None
    await asyncio.sleep(0)  # an asyncio library's call: an email API, a database
    ctx.state.append(payload.json()["to"])  # the worker's lifespan state: the app's outbox


def make_app(address: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with sepp.open(address) as client:
            app.state.jobs = client
            app.state.sent = sent = []

            @asynccontextmanager
            async def outbox() -> AsyncIterator[list[str]]:
                yield sent  # handlers see it as ctx.state

            worker = sepp.Worker(client, "emails", handlers=router, lifespan=outbox)
            running = asyncio.create_task(worker.run())
            await worker.wait_until_reserving()
            try:
                yield
            finally:
                worker.shutdown()  # stop reserving; running handlers finish first
                await running

    app = FastAPI(lifespan=lifespan)

    @app.post("/signup", status_code=202)
    async def signup(email: str, request: Request) -> dict[str, str]:
        client: sepp.Client = request.app.state.jobs
        ack = await client.enqueue(
            "emails", "send_welcome", payload=sepp.Payload.json({"to": email})
        )
        return {"job_id": ack.job_id}

    return app


app = make_app(os.environ.get("SEPP_ADDR", "127.0.0.1:50051"))
