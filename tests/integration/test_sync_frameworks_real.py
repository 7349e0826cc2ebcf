"""A Flask app under waitress (a real threaded WSGI server): concurrent HTTP requests, each
enqueuing through one shared module-level SyncClient; every job lands exactly once."""

from __future__ import annotations

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import trio
import waitress
from flask import Flask, request

import sepp
from sepp.testing import SeppServer

REQUESTS = 120


def make_app(client: sepp.SyncClient) -> Flask:
    app = Flask("signups")

    @app.post("/signup")
    def signup() -> dict[str, str]:
        email = request.form["email"]
        ack = client.enqueue("emails", "send_welcome", payload=sepp.Payload.json({"to": email}))
        return {"job_id": ack.job_id}

    return app


def post(port: int, n: int) -> str:
    body = f"email=user{n}%40example.com".encode()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/signup", data=body, timeout=60) as r:
        answer = json.loads(r.read())
    assert isinstance(answer["job_id"], str)
    return answer["job_id"]


async def test_flask_under_waitress_enqueues_each_request_once(sepp_server: SeppServer) -> None:
    client = sepp.SyncClient(sepp_server.address)  # module-level in a real app
    server = waitress.create_server(make_app(client), host="127.0.0.1", port=0, threads=8)
    port = server.effective_port  # type: ignore[union-attr]
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()

    def load() -> list[str]:
        with ThreadPoolExecutor(max_workers=24) as pool:
            return list(pool.map(lambda n: post(port, n), range(REQUESTS)))

    try:
        job_ids = await trio.to_thread.run_sync(load)
    finally:
        server.close()
        client.close()
    assert len(set(job_ids)) == REQUESTS

    async with sepp.open(sepp_server.address) as reader:
        jobs: list[sepp.Job] = []
        while batch := await reader.reserve("emails", max_jobs=256, wait_timeout=0):
            jobs += batch
    assert sorted(j.ctx.id for j in jobs) == sorted(job_ids)  # each request's job, once
    emails = sorted(j.payload.json()["to"] for j in jobs if j.payload is not None)
    assert emails == sorted(f"user{n}@example.com" for n in range(REQUESTS))
