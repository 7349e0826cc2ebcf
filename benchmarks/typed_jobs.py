"""Typed jobs: what decoding a payload into the handler's type costs a draining Worker.

    python -m benchmarks.typed_jobs [--jobs 6000] [--rounds 3]

One real sepp server (buffer mode), one process. Every round preloads the same 8-field JSON
payload (an order: UUID, datetime, Decimal, enum, nested list of dataclasses, optional field,
...) into a fresh queue per variant and drains it with a `sepp.Worker` (max_in_flight 64),
variants in an order that rotates every round:

- `untyped`: `payload: sepp.Payload | None`, never parsed (today's floor);
- `payload.json()`: the untyped handler parsing the JSON itself (today's usual handler);
- `dataclass`: `sepp.Task` of a dataclass, the default JSON codec;
- `pydantic`, `msgspec`: the same model as a pydantic v2 model / msgspec Struct.

Reported per variant: the median over rounds of this process's CPU per job during the drain
(`time.process_time`, so the server's CPU is not in it), its ratio to `untyped` in the same
round, and the decode alone (µs per payload, 20,000 decodes, no I/O), with its share of the
untyped drain's CPU per job. The machine is shared and noisy: ratios within one run mean more
than absolute numbers; the load average is printed with the results.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import trio

SRC = Path(__file__).resolve().parent.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import msgspec  # noqa: E402
import pydantic  # noqa: E402

import sepp  # noqa: E402
import sepp.testing  # noqa: E402


class Status(enum.Enum):
    NEW = "new"
    PAID = "paid"


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    qty: int


@dataclasses.dataclass(frozen=True)
class Order:
    id: uuid.UUID
    customer: int
    email: str
    placed_at: datetime
    total: Decimal
    status: Status
    lines: list[Line]
    note: str | None = None


class PydanticLine(pydantic.BaseModel):
    sku: str
    qty: int


class PydanticOrder(pydantic.BaseModel):
    id: uuid.UUID
    customer: int
    email: str
    placed_at: datetime
    total: Decimal
    status: Status
    lines: list[PydanticLine]
    note: str | None = None


class MsgspecLine(msgspec.Struct):
    sku: str
    qty: int


class MsgspecOrder(msgspec.Struct):
    id: uuid.UUID
    customer: int
    email: str
    placed_at: datetime
    total: Decimal
    status: Status
    lines: list[MsgspecLine]
    note: str | None = None


ORDER = Order(
    uuid.UUID(int=12345),
    42,
    "someone@example.com",
    datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc),
    Decimal("129.90"),
    Status.PAID,
    [Line("sku-1", 2), Line("sku-2", 1)],
)
PAYLOAD = sepp.JsonCodec().encode(ORDER)
MODELS: dict[str, type[Any]] = {
    "dataclass": Order,
    "pydantic": PydanticOrder,
    "msgspec": MsgspecOrder,
}
VARIANTS = ("untyped", "payload.json()", *MODELS)


def register(worker: sepp.Worker, variant: str, on_job: Callable[[], None]) -> None:
    if variant == "untyped":

        @worker.handler("order")
        async def untyped(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            on_job()

    elif variant == "payload.json()":

        @worker.handler("order")
        async def parsed(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            assert payload is not None
            payload.json()
            on_job()

    else:
        task: sepp.Task[Any] = sepp.Task("unused", "order", MODELS[variant])

        @worker.task(task)
        async def typed(job: Any, ctx: sepp.JobContext) -> None:
            on_job()


async def preload(client: sepp.Client, queue: str, n: int) -> None:
    for start in range(0, n, 500):
        count = min(500, n - start)
        await client.enqueue_batch(
            [sepp.EnqueueRequest(queue, "order", payload=PAYLOAD) for _ in range(count)]
        )


async def drain(client: sepp.Client, queue: str, variant: str, n: int) -> float:
    """CPU seconds per job of draining `n` jobs."""
    worker = sepp.Worker(client, queue, max_in_flight=64, lease_duration=60, wait_timeout=5)
    done = 0

    def on_job() -> None:
        nonlocal done
        done += 1
        if done >= n:
            worker.shutdown()

    register(worker, variant, on_job)
    began = time.process_time()
    with trio.fail_after(300):
        await worker.run()
    return (time.process_time() - began) / n


def decode_us(variant: str, calls: int = 20_000) -> float:
    """CPU µs to turn the payload into what the handler gets, per payload."""
    if variant == "untyped":
        return 0.0
    if variant == "payload.json()":

        def one() -> object:
            return PAYLOAD.json()

    else:
        task: sepp.Task[Any] = sepp.Task("unused", "order", MODELS[variant])
        decode, model = task.codec.decode, task.payload_type

        def one() -> object:
            return decode(PAYLOAD, model)

    one()
    began = time.process_time()
    for _ in range(calls):
        one()
    return (time.process_time() - began) / calls * 1e6


async def run(jobs: int, rounds: int) -> dict[str, dict[str, float]]:
    per_job: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
    config = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}
    async with sepp.testing.sepp_server(config) as server, sepp.open(server.address) as client:
        for variant in VARIANTS:  # warm-up: compile decoders, fill caches
            await preload(client, f"warm.{variant}", 200)
            await drain(client, f"warm.{variant}", variant, 200)
        for rnd in range(rounds):
            order = VARIANTS[rnd % len(VARIANTS) :] + VARIANTS[: rnd % len(VARIANTS)]
            this_round: dict[str, float] = {}
            for variant in order:
                queue = f"r{rnd}.{variant}"
                await preload(client, queue, jobs)
                this_round[variant] = await drain(client, queue, variant, jobs)
            for variant in VARIANTS:
                per_job[variant].append(this_round[variant])
                ratios[variant].append(this_round[variant] / this_round["untyped"])
            print(
                f"round {rnd + 1}/{rounds}: "
                + ", ".join(f"{v} {this_round[v] * 1e6:.0f} µs" for v in VARIANTS),
                file=sys.stderr,
            )
    untyped_us = statistics.median(per_job["untyped"]) * 1e6
    results = {}
    for variant in VARIANTS:
        decode = decode_us(variant)
        results[variant] = {
            "cpu_us_per_job": statistics.median(per_job[variant]) * 1e6,
            "ratio_to_untyped": statistics.median(ratios[variant]),
            "decode_us": decode,
            "decode_share": decode / (untyped_us + decode),
        }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args(argv)
    load = os.getloadavg()
    results = trio.run(run, opts.jobs, opts.rounds)
    print(f"{opts.jobs} jobs x {opts.rounds} rounds; {len(PAYLOAD.data)}-byte payload;", end=" ")
    print(f"load average {load[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print("| handler gets | CPU/job (drain) | vs untyped | decode alone | decode share |")
    print("|---|---:|---:|---:|---:|")
    for variant, r in results.items():
        print(
            f"| {variant} | {r['cpu_us_per_job']:.0f} µs | {r['ratio_to_untyped']:.2f}x"
            f" | {r['decode_us']:.1f} µs | {r['decode_share'] * 100:.1f} % |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
