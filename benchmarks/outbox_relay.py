"""The outbox relay's throughput: rows written with `sepp.Outbox.add`, relayed by
`sepp.OutboxRelay` (trio task, sqlite3 file, `batch_size=100`) to a real sepp server.

    python -m benchmarks.outbox_relay [--rows 3000] [--rounds 3]

Per round: a fresh sqlite3 file with `--rows` rows (256-byte payloads, one queue), written in
one transaction (untimed), then the relay started and timed until it has relayed them all:
jobs/s and this process's CPU per job (the relay's database calls run in threads, counted too).
sepp-py has no outbox, so there is nothing to compare it with side by side.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time

import trio

from ._drivers import REPO

if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

import sepp
import sepp.testing

PAYLOAD = sepp.Payload(b"x" * 256, "application/octet-stream")


async def amain(rows: int, rounds: int) -> None:
    config = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}
    rates: list[float] = []
    cpus: list[float] = []
    async with sepp.testing.sepp_server(config) as server, sepp.open(server.address) as client:
        for index in range(rounds):
            fd, path = tempfile.mkstemp(suffix=".db")
            os.close(fd)
            try:
                db = sqlite3.connect(path)
                outbox = sepp.Outbox()
                outbox.create_table(db)
                with db:
                    for _ in range(rows):
                        outbox.add(db, f"outbox.{index}", "bench", payload=PAYLOAD)
                db.close()
                relay = sepp.OutboxRelay(f"sqlite:///{path}", batch_size=100)
                cpu0, wall0 = time.process_time(), time.perf_counter()
                async with trio.open_nursery() as nursery:
                    await nursery.start(relay.run, client)
                    while relay.counters.relayed < rows:  # noqa: ASYNC110 (counters, no event)
                        await trio.sleep(0.005)
                    wall1, cpu1 = time.perf_counter(), time.process_time()
                    relay.shutdown()
            finally:
                os.unlink(path)
            rates.append(rows / (wall1 - wall0))
            cpus.append((cpu1 - cpu0) / rows * 1e6)
            print(f"round {index + 1}: {rates[-1]:,.0f} jobs/s, CPU {cpus[-1]:.1f} µs per job")
    print(
        f"median: {statistics.median(rates):,.0f} jobs/s ({min(rates):,.0f}-{max(rates):,.0f}),"
        f" CPU {statistics.median(cpus):.1f} µs per job ({min(cpus):.1f}-{max(cpus):.1f})"
    )


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.outbox_relay", description=__doc__)
    p.add_argument("--rows", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    trio.run(amain, a.rows, a.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
