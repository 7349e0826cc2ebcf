"""grpcio's blocking client under compare_sync.py's load, printed as one JSON line:

    $SEPPY_PYTHON tests/proxies/grpcio_blocking_load.py ADDRESS QUEUE JOBS THREADS [PID:SIG:A,B]
        [--tls CA_PEM_PATH SERVER_NAME]

Run with sepp-py's python (grpcio and sepp-py's generated stub, as benchmarks/blocking_driver.py
does). THREADS threads share one `grpc.insecure_channel` and make JOBS single-job EnqueueBatch
calls, the jobs of fixtures/proxy_load.py (payload `job-<i>`, even ones keyed), with grpcio's
defaults (no retry policy in the service config). The optional last argument sends signal SIG to
PID once A, then B, ... calls have ended (nginx reloads at the same points as for SyncClient).
`--tls` connects over TLS, trusting the CA in CA_PEM_PATH for SERVER_NAME.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

CALL_TIMEOUT_S = 60.0  # grpcio waits forever without one; a hang would hang the comparison


def main(argv: list[str]) -> dict[str, Any]:
    import grpc
    from sepp.v1 import queue_pb2 as pb
    from sepp.v1 import queue_pb2_grpc as pb_grpc

    tls: list[str] = []
    if "--tls" in argv:
        at = argv.index("--tls")
        argv, tls = argv[:at] + argv[at + 3 :], argv[at + 1 : at + 3]
    address, queue, jobs, threads = argv[0], argv[1], int(argv[2]), int(argv[3])
    pid = signum = 0
    marks: list[int] = []
    if len(argv) > 4:
        pid_text, sig_text, marks_text = argv[4].split(":")
        pid, signum = int(pid_text), int(sig_text)
        marks = sorted(int(m) for m in marks_text.split(","))
    if tls:
        with open(tls[0], "rb") as ca:
            credentials = grpc.ssl_channel_credentials(root_certificates=ca.read())
        options = [("grpc.ssl_target_name_override", tls[1])]
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address)
    stub = pb_grpc.QueueServiceStub(channel)
    indexes = iter(range(jobs))
    lock = threading.Lock()
    ended = [0]
    errors: dict[str, int] = {}
    deduplicated = [0]

    def producer() -> None:
        while True:
            with lock:
                index = next(indexes, None)
            if index is None:
                return
            data = f"job-{index}".encode()
            job = pb.EnqueueRequest(
                queue=queue,
                job_type="proxied",
                payload=pb.Payload(data=data, encoding="application/octet-stream"),
            )
            if index % 2 == 0:
                job.idempotency_key = data.decode()
            failure = None
            try:
                response = stub.EnqueueBatch(
                    pb.EnqueueBatchRequest(jobs=[job]), timeout=CALL_TIMEOUT_S
                )
            except grpc.RpcError as exc:
                failure = f"{exc.code().name}: {str(exc.details())[:80]}"
            with lock:
                if failure is not None:
                    errors[failure] = errors.get(failure, 0) + 1
                elif response.results[0].success.deduplicated:
                    deduplicated[0] += 1
                ended[0] += 1
                while marks and ended[0] >= marks[0]:
                    marks.pop(0)
                    os.kill(pid, signum)

    workers = [threading.Thread(target=producer) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    channel.close()
    return {"errors": errors, "deduplicated": deduplicated[0]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
