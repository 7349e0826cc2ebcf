"""One blocking-client measurement in a fresh process, printed as one JSON line:

    PYTHON benchmarks/blocking_driver.py CLIENT ADDRESS QUEUE JOBS THREADS

CLIENT is `sepp-trio` (sepp.SyncClient), `grpcio` (grpcio's blocking unary call with sepp-py's
generated stub: run it with sepp-py's python) or `sockets-prototype` (the design we measured
against SyncClient's and did not build, see below). Each thread makes JOBS/THREADS sequential
single-job EnqueueBatch calls (256-byte payload) on one shared client; wall time from
perf_counter, CPU from this process's process_time (all threads, grpcio's C-core ones too).
"""

from __future__ import annotations

import json
import socket
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


def sockets_prototype_call(address: str, queue: str) -> Callable[[], None]:
    """Design (a), prototyped only: blocking sockets driving the sans-IO codec, the calling
    threads taking turns as the reader (leader/follower), no event loop and no thread hops when
    one thread calls. No TLS, deadlines, reconnects, GOAWAY or retries: enough to size it."""
    import sepp
    from sepp import _convert as cv
    from sepp._pb import queue_pb2 as pb
    from sepp.wire._codec import CodecGrpcConnection
    from sepp.wire._events import CallFinished

    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    proto = CodecGrpcConnection(authority=address)
    proto.initiate()
    sock.sendall(proto.data_to_send())
    lock = threading.Lock()
    waiters: dict[int, Waiter] = {}
    reading = [False]

    class Waiter:
        def __init__(self) -> None:
            self.wake = threading.Lock()
            self.wake.acquire()
            self.signalled = False
            self.lead = False
            self.result: CallFinished | None = None

        def signal(self) -> None:  # under `lock`
            if not self.signalled:
                self.signalled = True
                self.wake.release()

    def rpc(body: bytes) -> bytes:
        me = Waiter()
        with lock:
            sid = proto.start_call("EnqueueBatch", body, timeout=30.0)
            waiters[sid] = me
            sock.sendall(proto.data_to_send())
            me.lead = not reading[0]
            reading[0] = True
        while True:
            if me.lead:
                try:
                    while me.result is None:
                        data = sock.recv(262144)
                        if not data:
                            raise ConnectionError("closed")
                        with lock:
                            events = proto.receive_data(data)
                            out = proto.data_to_send()
                            if out:
                                sock.sendall(out)
                            for event in events:
                                if type(event) is CallFinished:
                                    waiter = waiters.pop(event.stream_id, None)
                                    if waiter is not None:
                                        waiter.result = event
                                        if waiter is not me:
                                            waiter.signal()
                finally:
                    with lock:  # hand the reader's role to a waiting thread
                        reading[0] = False
                        for waiter in waiters.values():
                            reading[0] = waiter.lead = True
                            waiter.signal()
                            break
                assert me.result.body is not None
                return me.result.body
            me.wake.acquire()
            with lock:
                me.signalled = False
                if me.result is not None:
                    assert me.result.body is not None
                    return me.result.body

    request = sepp.EnqueueRequest(queue, "bench", payload=sepp.Payload(PAYLOAD, ENCODING))
    body = cv.enqueue_batch_to_pb([request])

    def call() -> None:
        response = pb.EnqueueBatchResponse.FromString(rpc(body))
        assert response.results[0].WhichOneof("outcome") == "success"

    return call


CLIENTS = {
    "sepp-trio": sepp_trio_call,
    "grpcio": grpcio_call,
    "sockets-prototype": sockets_prototype_call,
}


def run(call: Callable[[], None], calls: int, threads: int) -> dict[str, Any]:
    per_thread = calls // threads

    def work() -> None:
        for _ in range(per_thread):
            call()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    wall, cpu = time.perf_counter(), time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = per_thread * threads
    return {"ops": done, "ops_s": done / wall, "cpu_ms_per_call": cpu / done * 1e3}


def main() -> None:
    client, address, queue, jobs, threads = sys.argv[1:6]
    if client != "grpcio":  # the checkout's src/ is what we measure
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    call = CLIENTS[client](address, queue)
    run(call, WARMUP_CALLS, 1)
    result = run(call, int(jobs), int(threads))
    print(json.dumps({"client": client, "threads": int(threads), **result}), flush=True)


if __name__ == "__main__":
    main()
