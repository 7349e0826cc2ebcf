"""examples/fastapi_app.py under a real uvicorn server (asyncio and uvloop): concurrent HTTP
requests enqueue through the app's one client, the Worker in the same process handles every
job exactly once, and the lifespan's end drains it."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import threading
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import trio
import uvicorn

import sepp
from sepp.testing import SeppServer

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 120


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_app", ROOT / "examples/fastapi_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def post_all(port: int) -> list[str]:
    limits = httpx.Limits(max_connections=24)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits) as http:

        async def post(n: int) -> str:
            response = await http.post("/signup", params={"email": f"user{n}@example.com"})
            assert response.status_code == 202, response.text
            job_id = response.json()["job_id"]
            assert isinstance(job_id, str)
            return job_id

        return await asyncio.gather(*(post(n) for n in range(REQUESTS)))


@pytest.mark.parametrize(
    "loop", ["asyncio", pytest.param("uvloop", marks=pytest.mark.needs("uvloop"))]
)
async def test_fastapi_under_uvicorn_enqueues_and_handles_each_request_once(
    sepp_server: SeppServer, loop: str
) -> None:
    app = load_example().make_app(sepp_server.address)
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, loop=loop, lifespan="on", log_level="warning", access_log=False)
    )
    serving = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    serving.start()
    try:
        with trio.fail_after(30):
            while not server.started:
                if not serving.is_alive():
                    raise AssertionError("uvicorn stopped before it started")
                await trio.sleep(0.01)
        job_ids = await trio.to_thread.run_sync(asyncio.run, post_all(port))
        with trio.fail_after(30):
            # The handlers run in uvicorn's loop, in another thread: poll what they recorded.
            while len(app.state.sent) < REQUESTS:  # noqa: ASYNC110
                await trio.sleep(0.01)
    finally:
        server.should_exit = True  # the lifespan's end: the worker drains, the client closes
        await trio.to_thread.run_sync(serving.join, 30)
        listening.close()
    assert not serving.is_alive()
    assert len(set(job_ids)) == REQUESTS
    assert sorted(app.state.sent) == sorted(f"user{n}@example.com" for n in range(REQUESTS))

    async with sepp.open(sepp_server.address) as reader:  # every job acked: none left
        assert await reader.reserve("emails", wait_timeout=0) is None
