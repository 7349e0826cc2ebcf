"""The client-side work of one `enqueue_batch`, piece by piece, without sockets or a server.

    python -m benchmarks.batch_path [--jobs 100] [--batches 300]
    python -m benchmarks.batch_path --only encode --batches 120   # one piece, for callgrind

The pieces, each per batch of `--jobs` jobs (256-byte payloads, one queue and job type, as
the harness's `enqueue_batch` scenario builds them): `build` (the EnqueueRequests, with their
checks), `check` (the server's limits, as the client checks them before sending, and the
size estimate that decides whether the batch is one call), `encode`
(the EnqueueBatchRequest, with the codec `SEPP_MESSAGE_CODEC` selects: "auto" by default),
`read` (an answer of one success per job, recorded as the server lays it out) and `whole`
(all four). Prints µs of CPU per batch (best of 5).

Instruction counts, which the load of a shared machine does not move (see
benchmarks/README.md, "The batch path"): run one piece under callgrind twice, with
`--batches 20` and `--batches 120`, and divide the difference of the totals by 100.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from ._drivers import REPO

if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

import sepp
from sepp._client import operations as ops
from sepp._client.chunking import split_batch
from sepp._client.limits import ServerLimits
from sepp._model import message_codec as mc
from sepp._model.types import ServerInfo

PAYLOAD = sepp.Payload(b"x" * 256, "application/octet-stream")


def _response(jobs: int) -> bytes:
    """One success per job, each with a 26-character id, as the server writes them."""
    out = bytearray()
    for index in range(jobs):
        job_id = f"01JB{index:022d}".encode()
        ack = b"\x0a" + bytes((len(job_id),)) + job_id
        result = b"\x0a" + bytes((len(ack),)) + ack
        out += b"\x0a" + bytes((len(result),)) + result
    return bytes(out)


def _limits() -> ServerLimits:
    """The limits of a sepp 0.1.1 server with its defaults (none of them is hit here)."""
    now = datetime.now(timezone.utc)
    info = ServerInfo(
        server_version="0.1.1",
        supported_protocol_versions=("1",),
        server_time=now,
        restricts_encodings=False,
        allowed_encodings=(),
        max_payload_bytes=1 << 20,
        max_custom_entries=64,
        max_custom_total_bytes=16384,
        max_custom_key_bytes=128,
        max_queue_name_bytes=255,
        max_job_type_bytes=255,
        max_idempotency_key_bytes=255,
        max_schedule_horizon=timedelta(days=365),
        max_enqueue_batch=256,
        max_reserve_batch=256,
        max_reserve_queues=16,
        max_wait_timeout=timedelta(seconds=60),
        max_lease_duration=timedelta(hours=1),
        strict_queues=False,
        dead_letter_retention_enabled=True,
    )
    return ServerLimits(info, now)


def pieces(jobs: int) -> dict[str, Callable[[], object]]:
    mc.preload()
    body = _response(jobs)
    limits = _limits()
    batch = [sepp.EnqueueRequest("bench.q", "bench", payload=PAYLOAD) for _ in range(jobs)]

    def build() -> list[sepp.EnqueueRequest]:
        return [sepp.EnqueueRequest("bench.q", "bench", payload=PAYLOAD) for _ in range(jobs)]

    def whole() -> object:
        requests = ops.job_requests(build())
        assert limits.check_all(requests) is None
        assert len(split_batch(requests, max_jobs=256)) == 1
        ops.enqueue_batch_call(requests, None)
        return ops.read_enqueue_batch(body, len(requests))

    return {
        "build": build,
        "check": lambda: (limits.check_all(batch), split_batch(batch, max_jobs=256)),
        "encode": lambda: mc.REQUESTS.enqueue_batch(batch, None),
        "read": lambda: ops.read_enqueue_batch(body, jobs),
        "whole": whole,
    }


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batch_path", description=__doc__)
    p.add_argument("--jobs", type=int, default=100, help="jobs per batch")
    p.add_argument("--batches", type=int, default=300, help="batches per measurement")
    p.add_argument("--only", default=None, help="run one piece --batches times, print nothing")
    a = p.parse_args()
    found = pieces(a.jobs)
    if a.only:
        fn = found[a.only]
        for _ in range(a.batches):
            fn()
        return 0
    print(f"codec {mc.NAME}: encode with {getattr(mc.REQUESTS.enqueue_batch, '__name__', '?')}")
    for name, fn in found.items():
        best = float("inf")
        for _ in range(5):
            start = time.process_time()
            for _ in range(a.batches):
                fn()
            best = min(best, time.process_time() - start)
        print(f"{name:>7}: {best / a.batches * 1e6:8.1f} µs CPU per batch of {a.jobs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
