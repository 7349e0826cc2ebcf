"""One chaos worker process: `python chaos_worker.py ADDR RECORD_FILE [options]`.

Runs a `sepp.Worker` against ADDR until SIGTERM (or SIGINT), then shuts it down gracefully
and exits 0. Everything it does goes to RECORD_FILE, one line per event, so the harness can
check the run after the fact, even after this process was SIGKILLed:

    <kind> <unix time> <job id or -> <attempt or -> <detail>

    P  ready: the worker is reserving (detail: pid and name)
    R  a reserve returned this job
    S  the handler started the job (detail: the job's idempotency key)
    D  the handler finished the job; written, flushed and fsynced BEFORE the handler returns
    A  ack succeeded            AE ack failed (detail: the error's class)
    N  nack succeeded (detail: reason)   NE nack failed (detail: the error's class)
    E  lease extended           EE extend failed (detail: the error's class)
    T  SIGTERM received: shutdown requested
    X  run() returned: clean exit

Every line is flushed at once (a SIGKILL loses nothing the OS has seen); D lines are also
fsynced. Logs (the `sepp` logger at INFO, everything else at WARNING) go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import time
from datetime import timedelta
from typing import IO, Any

import trio

import sepp


class Recorder:
    """An append-only event file."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")

    def note(self, kind: str, job_id: str = "-", attempt: object = "-", detail: str = "-") -> None:
        self._file.write(f"{kind} {time.time():.6f} {job_id} {attempt} {detail}\n")
        self._file.flush()

    def durable(self, kind: str, job_id: str, attempt: int, detail: str) -> None:
        self.note(kind, job_id, attempt, detail)
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def _word(text: str | None) -> str:
    return "-" if not text else "_".join(text.split())


class RecordingClient:
    """Wraps the real client and records reserves and ack/nack outcomes. Duck-types the four
    calls the Worker uses."""

    def __init__(self, client: sepp.Client, rec: Recorder) -> None:
        self._client = client
        self._rec = rec

    async def reserve(self, *args: Any, **kwargs: Any) -> list[sepp.Job] | None:
        jobs = await self._client.reserve(*args, **kwargs)
        for job in jobs or ():
            self._rec.note("R", job.id, job.ctx.attempt)
        return jobs

    async def ack(self, ctx: sepp.JobContext, **kwargs: Any) -> None:
        try:
            await self._client.ack(ctx, **kwargs)
        except Exception as exc:
            self._rec.note("AE", ctx.id, ctx.attempt, type(exc).__name__)
            raise
        self._rec.note("A", ctx.id, ctx.attempt)

    async def nack(self, ctx: sepp.JobContext, **kwargs: Any) -> bool:
        try:
            dead = await self._client.nack(ctx, **kwargs)
        except Exception as exc:
            self._rec.note("NE", ctx.id, ctx.attempt, type(exc).__name__)
            raise
        self._rec.note("N", ctx.id, ctx.attempt, _word(kwargs.get("reason")))
        return dead

    async def extend(
        self, ctx: sepp.JobContext, lease_duration: float | timedelta, **kwargs: Any
    ) -> Any:
        try:
            expiry = await self._client.extend(ctx, lease_duration, **kwargs)
        except Exception as exc:
            self._rec.note("EE", ctx.id, ctx.attempt, type(exc).__name__)
            raise
        self._rec.note("E", ctx.id, ctx.attempt)
        return expiry


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("addr")
    p.add_argument("record")
    p.add_argument("--name", default=f"w{os.getpid()}")
    p.add_argument("--queue", default="chaos")
    p.add_argument("--lease", type=float, default=4.0)
    p.add_argument("--max-in-flight", type=int, default=16)
    p.add_argument("--wait", type=float, default=2.0, help="reserve long-poll, seconds")
    p.add_argument("--shutdown-timeout", type=float, default=10.0)
    p.add_argument("--sleep-ms", default="0:4", help="handler time, uniform MIN:MAX ms")
    p.add_argument("--slow-fraction", type=float, default=0.0, help="share of slow jobs")
    p.add_argument("--slow-ms", default="1000:3000", help="slow job time, MIN:MAX ms")
    p.add_argument("--probe-ms", type=float, default=250.0, help="handler time of 'probe' jobs")
    p.add_argument("--hang", action="store_true", help="handlers never finish (kill victim)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _range_s(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low) / 1000, float(high or low) / 1000


async def run(args: argparse.Namespace, rec: Recorder) -> None:
    sleep_low, sleep_high = _range_s(args.sleep_ms)
    slow_low, slow_high = _range_s(args.slow_ms)
    rng = random.Random(f"{args.seed}-{args.name}")
    retry = sepp.RetryPolicy(max_attempts=8, initial_backoff=0.05, max_backoff=1.0)
    async with sepp.open(args.addr, retry_policy=retry, connect_timeout=2.0) as client:
        worker = sepp.Worker(
            RecordingClient(client, rec),  # type: ignore[arg-type]
            args.queue,
            lease_duration=args.lease,
            max_in_flight=args.max_in_flight,
            wait_timeout=args.wait,
            shutdown_timeout=args.shutdown_timeout,
            reserve_error_backoff=0.1,
            worker_id=args.name,
        )

        @worker.handler("chaos")
        async def chaos(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            key = str(payload.json()["key"]) if payload is not None else "-"
            rec.note("S", ctx.id, ctx.attempt, key)
            if args.hang:
                await trio.sleep_forever()
            if rng.random() < args.slow_fraction:  # long enough that its lease is extended
                await trio.sleep(rng.uniform(slow_low, slow_high))
            else:
                await trio.sleep(rng.uniform(sleep_low, sleep_high))
            rec.durable("D", ctx.id, ctx.attempt, key)

        @worker.handler("probe")
        async def probe(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            key = str(payload.json()["key"]) if payload is not None else "-"
            rec.note("S", ctx.id, ctx.attempt, key)
            await trio.sleep(args.probe_ms / 1000)
            rec.durable("D", ctx.id, ctx.attempt, key)

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def watch_signals() -> None:
                    async for signum in signals:
                        rec.note("T", detail=signal.Signals(signum).name)
                        worker.shutdown()

                async def run_worker(task_status: trio.TaskStatus[None]) -> None:
                    await worker.run(task_status=task_status)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch_signals)
                await nursery.start(run_worker)
                rec.note("P", detail=f"{os.getpid()}:{args.name}")
    rec.note("X")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("sepp").setLevel(logging.INFO)
    rec = Recorder(args.record)
    try:
        trio.run(run, args, rec)
    finally:
        rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
