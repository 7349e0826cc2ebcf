"""One blocking-client measurement in a fresh process, printed as one JSON line:

    PYTHON benchmarks/blocking_driver.py CLIENT ADDRESS QUEUE JOBS THREADS[,THREADS...]

CLIENT is `sepp-trio` (sepp.SyncClient), `grpcio` (grpcio's blocking unary call with sepp-py's
generated stub: run it with sepp-py's python) or `trio-portal` (SyncClient's previous design,
still used with `enqueue_batching`: the trio client on a thread of its own). Each thread makes
JOBS/THREADS sequential
single-job EnqueueBatch calls (256-byte payload) on one shared client; wall time from
perf_counter, CPU from this process's process_time (all threads, grpcio's C-core ones too).
With several thread counts (`1,8`: benchmarks/threads.py), the same client runs each in turn,
in that order, and the line holds one result per count under "runs".
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAYLOAD = b"x" * 256
ENCODING = "application/octet-stream"
WARMUP_CALLS = 200


def grpcio_call(address: str, queue: str) -> Callable[[], None]:
    import grpc
    from sepp.v1 import queue_pb2 as pb
    from sepp.v1 import queue_pb2_grpc as pb_grpc

    stub = pb_grpc.QueueServiceStub(grpc.insecure_channel(address))

    def call() -> None:
        job = pb.EnqueueRequest(
            queue=queue, job_type="bench", payload=pb.Payload(data=PAYLOAD, encoding=ENCODING)
        )
        response = stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job]), timeout=30)
        assert response.results[0].WhichOneof("outcome") == "success"

    return call


def sepp_trio_call(address: str, queue: str) -> Callable[[], None]:
    import sepp

    client = sepp.SyncClient(address)
    request = sepp.EnqueueRequest(queue, "bench", payload=sepp.Payload(PAYLOAD, ENCODING))

    def call() -> None:
        client.enqueue(request)

    return call


def trio_portal_call(address: str, queue: str) -> Callable[[], None]:
    """The design SyncClient had before (and keeps for `enqueue_batching`): the trio Client
    in its own trio.run on a daemon thread, each call handed over to it and waited for."""
    import sepp
    from sepp._client.client import Client
    from sepp._client.sync import _Portal

    portal = _Portal.start(address, {})
    request = sepp.EnqueueRequest(queue, "bench", payload=sepp.Payload(PAYLOAD, ENCODING))

    def call() -> None:
        portal.run(Client.enqueue, request)

    return call


CLIENTS = {
    "sepp-trio": sepp_trio_call,
    "grpcio": grpcio_call,
    "trio-portal": trio_portal_call,
}


def run(call: Callable[[], None], calls: int, threads: int) -> dict[str, Any]:
    per_thread = calls // threads

    def work() -> None:
        for _ in range(per_thread):
            call()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    switches = _context_switches()
    wall, cpu = time.perf_counter(), time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    switches = _context_switches() - switches
    done = per_thread * threads
    return {
        "ops": done,
        "ops_s": done / wall,
        "cpu_ms_per_call": cpu / done * 1e3,
        "switches_per_call": switches / done,
    }


def _context_switches() -> int:
    """This process's context switches so far, voluntary (a thread blocked: a wait, a lock,
    a poll) and not (preempted): the thread hand-offs a call costs show up here."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def main() -> None:
    client, address, queue, jobs, threads = sys.argv[1:6]
    if client != "grpcio":  # the checkout's src/ is what we measure
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    call = CLIENTS[client](address, queue)
    run(call, WARMUP_CALLS, 1)
    counts = [int(n) for n in threads.split(",")]
    runs = [{"threads": n, **run(call, int(jobs), n)} for n in counts]
    line = {"client": client, **runs[0]} if len(runs) == 1 else {"client": client, "runs": runs}
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
