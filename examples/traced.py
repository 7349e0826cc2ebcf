"""Producer → worker tracing in one run, printed by the console span exporter.

Needs the `otel` extra plus the SDK (`pip install 'sepp-trio[otel]' opentelemetry-sdk`).
Runs against $SEPP_ADDR, or a throw-away server started with sepp.testing.
"""

from __future__ import annotations

import os
from contextlib import AsyncExitStack

import trio
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import sepp

provider = TracerProvider(resource=Resource.create({"service.name": "sepp-trio-traced-demo"}))
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("traced-demo")


async def main() -> None:
    async with AsyncExitStack() as stack:
        address = os.environ.get("SEPP_ADDR")
        if not address:
            from sepp.testing import sepp_server

            address = (await stack.enter_async_context(sepp_server())).address
        client = await stack.enter_async_context(sepp.open(address))

        # The producer: an incoming request that enqueues a job.
        with tracer.start_as_current_span("POST /signup"):
            ack = await client.enqueue("emails", "send_welcome", payload=sepp.Payload.json(42))
        print(f"enqueued {ack.job_id}")

        # The worker: its sepp.process span links back to the producer's trace.
        worker = sepp.Worker(client, ["emails"], max_in_flight=1)
        done = trio.Event()

        @worker.handler("send_welcome")
        async def send_welcome(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            with tracer.start_as_current_span("smtp.send"):
                await trio.sleep(0.01)
            print(f"processed {ctx.id}")
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await done.wait()
            worker.shutdown()
    provider.shutdown()


if __name__ == "__main__":
    trio.run(main)
