"""The examples run as written against a real server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from sepp.testing import SeppServer

ROOT = Path(__file__).resolve().parents[2]


async def run_example(name: str, address: str) -> str:
    env = {**os.environ, "SEPP_ADDR": address, "PYTHONPATH": str(ROOT / "src")}
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, str(ROOT / "examples" / name)],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_main_example_enqueues_and_processes(sepp_server: SeppServer) -> None:
    out = await run_example("main.py", sepp_server.address)
    assert out.count("enqueued job ") == 3 and out.count("acked job ") == 3
    assert "done: 3 jobs enqueued and processed" in out


async def test_traced_example_links_the_worker_to_the_producer(sepp_server: SeppServer) -> None:
    out = await run_example("traced.py", sepp_server.address)
    assert '"name": "sepp.process"' in out and '"name": "POST /signup"' in out
    producer_trace = out.split('"name": "POST /signup"')[1].split('"trace_id": "')[1][:34]
    process = out.split('"name": "sepp.process"')[1]
    links = process.split('"links": [')[1].split("]")[0]
    assert producer_trace in links
