"""SyncClient's calls keep the async client's types (overloads included) and its options are
open()'s: misuse is refused by the type checker; `def` handlers type-check."""

from __future__ import annotations

from datetime import datetime

import sepp


def produce(client: sepp.SyncClient) -> None:
    ack: sepp.EnqueueAck = client.enqueue("q", "t", priority=1, timeout=2.0)
    again: sepp.EnqueueAck = client.enqueue(sepp.EnqueueRequest("q", "t"))
    results: list[sepp.EnqueueAck | sepp.JobRejection] = client.enqueue_batch([])
    info: sepp.ServerInfo = client.get_server_info()
    client.enqueue(sepp.EnqueueRequest("q", "t"), "t")  # type: ignore[call-overload]
    client.enqueue("q", "t", priority="high")  # type: ignore[call-overload]
    print(ack, again, results, info)


def consume(client: sepp.SyncClient) -> None:
    jobs = client.reserve("q", wait_timeout=1)
    for job in jobs or []:
        expires: datetime = client.extend(job.ctx, 30)
        client.ack(job.ctx)
        print(expires)
    client.ack("not a ctx")  # type: ignore[arg-type]


def connect() -> None:
    with sepp.connect("localhost:50051", rpc_timeout=5, api_key=None) as client:
        produce(client)
    sepp.SyncClient("localhost:50051", rpc_timout=5)  # type: ignore[call-arg]
    sepp.SyncClient("localhost:50051", connect_timeout="5s")  # type: ignore[arg-type]


def handlers(router: sepp.Router) -> None:
    def plain(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        pass

    router.handle("a", plain)
    router.handler("b")(plain)
