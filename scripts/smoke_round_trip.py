"""The release smoke test: an installed sepp-trio talks to a real sepp server.

Run by `make release-check` with the python of a fresh virtualenv holding only the built wheel
(and its dependencies), from outside the source tree, so `import sepp` is the installed copy.
It starts a throw-away server with `sepp.testing` ($SEPP_BIN), enqueues a job, reserves and
acks it, processes one more with a `Worker`, and runs the `sepp-trio` console script.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

import sepp
from sepp.testing import sepp_server


async def main() -> None:
    assert "site-packages" in Path(sepp.__file__).parts, f"not the installed copy: {sepp.__file__}"
    async with sepp_server() as server, sepp.open(server.address) as client:
        ack = await client.enqueue("smoke", "ping", payload=sepp.Payload.json({"n": 1}))
        jobs = await client.reserve(["smoke"], lease_duration=30, wait_timeout=5)
        assert jobs and jobs[0].id == ack.job_id and jobs[0].payload is not None
        assert jobs[0].payload.json() == {"n": 1}
        await client.ack(jobs[0].ctx)

        handled: list[object] = []
        done = trio.Event()
        router = sepp.Router()

        @router.handler("pong")
        async def pong(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            handled.append(payload.json() if payload else None)
            done.set()

        await client.enqueue("smoke", "pong", payload=sepp.Payload.json({"n": 2}))
        worker = sepp.Worker(client, "smoke", handlers=router, wait_timeout=1)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await done.wait()
                worker.shutdown()
        assert handled == [{"n": 2}], handled

        script = Path(sys.executable).with_name("sepp-trio")
        info = await trio.run_process(
            [str(script), "--address", server.address, "info"], capture_stdout=True
        )
        assert b"max" in info.stdout, info.stdout
    print(f"smoke: sepp-trio {sepp.__version__} on Python {sys.version.split()[0]}: round trip ok")


if __name__ == "__main__":
    trio.run(main)
