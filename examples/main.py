"""End-to-end demo: enqueue a few jobs, then process them with raw reserve/ack.

Runs against $SEPP_ADDR, or against a throw-away sepp server it starts itself when none is
given (`make demo`).
"""

from __future__ import annotations

import os
from contextlib import AsyncExitStack

import trio

import sepp


async def produce(client: sepp.Client) -> list[str]:
    ack = await client.enqueue(
        "emails",
        "send_welcome",
        payload=sepp.Payload.json({"user": 42, "email": "ada@example.com"}),
        idempotency_key="welcome-42",
        priority=5,
        custom={"tenant": "acme", "attempted_by": "demo"},
    )
    print(f"enqueued job {ack.job_id} (deduplicated={ack.deduplicated})")
    batch = await client.enqueue_batch(
        [
            sepp.EnqueueRequest("emails", "send_receipt", payload=sepp.Payload.text(f"order {n}"))
            for n in (1, 2)
        ]
    )
    ids = [ack.job_id]
    for result in batch:
        if isinstance(result, sepp.EnqueueAck):
            print(f"enqueued job {result.job_id}")
            ids.append(result.job_id)
        else:
            print(f"rejected: {sepp.describe_job_rejection(result)}")
    return ids


async def consume(client: sepp.Client, expected: int) -> None:
    done = 0
    while done < expected:
        jobs = await client.reserve(["emails"], lease_duration=30, wait_timeout=5, max_jobs=8)
        if jobs is None:
            print("no more jobs")
            return
        for job in jobs:
            body = job.payload.json() if job.ctx.job_type == "send_welcome" else None
            text = job.payload.text() if job.payload and body is None else body
            print(
                f"processing job {job.id}: {job.ctx.job_type} priority={job.ctx.priority} "
                f"attempt={job.ctx.attempt}/{job.ctx.max_attempts} payload={text!r}"
            )
            await client.ack(job.ctx)
            print(f"acked job {job.id}")
            done += 1


async def main() -> None:
    async with AsyncExitStack() as stack:
        address = os.environ.get("SEPP_ADDR")
        if not address:
            from sepp.testing import sepp_server

            server = await stack.enter_async_context(sepp_server())
            address = server.address
            print(f"started a sepp server at {address}")
        client = await stack.enter_async_context(sepp.open(address))
        info = await client.get_server_info()
        print(f"connected to sepp {info.server_version} at {address}")
        ids = await produce(client)
        await consume(client, len(ids))
        print(f"done: {len(ids)} jobs enqueued and processed")


if __name__ == "__main__":
    trio.run(main)
