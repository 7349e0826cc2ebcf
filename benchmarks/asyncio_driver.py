"""JSON-lines benchmark driver for sepp-trio's asyncio front end: the twin of trio_driver.py
(same protocol, same `bench_enqueue`, `bench_drain_raw` and `bench_drain_worker` semantics),
on asyncio's default loop or on uvloop.

    python benchmarks/asyncio_driver.py [--loop asyncio|uvloop] [--no-otel] [--src DIR]
"""

from __future__ import annotations

import sys
from typing import Any

_ARGS = sys.argv[1:]


class _BlockOtel:
    """A meta-path finder that makes ``opentelemetry`` unimportable."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by --no-otel)")
        return None


if sys.path and sys.path[0].rstrip("/").endswith("benchmarks"):
    del sys.path[0]
if "--no-otel" in _ARGS:
    sys.meta_path.insert(0, _BlockOtel())
if "--src" in _ARGS:
    sys.path.insert(0, _ARGS[_ARGS.index("--src") + 1])
LOOP = _ARGS[_ARGS.index("--loop") + 1] if "--loop" in _ARGS else "asyncio"

import asyncio  # noqa: E402
import contextlib  # noqa: E402
import cProfile  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402

import sepp  # noqa: E402

Request = dict[str, Any]
Result = dict[str, Any]


class DriverError(Exception):
    """A problem with the request itself, or a bench run that went wrong."""


def _payload(size: int) -> sepp.Payload | None:
    return sepp.Payload(b"x" * size, "application/octet-stream") if size > 0 else None


@contextlib.contextmanager
def _measure(out: Result, req: Request | None = None) -> Any:
    """Time the block: wall and this process's CPU; with the request's `profile_out`, under
    cProfile, written there (as the trio driver does)."""
    profile_out = req.get("profile_out") if req is not None else None
    prof = cProfile.Profile() if profile_out else None
    c0, t0 = time.process_time(), time.perf_counter()
    if prof is not None:
        prof.enable()
    try:
        yield
    finally:
        if prof is not None:
            prof.disable()
        out["elapsed_s"] = time.perf_counter() - t0
        out["cpu_s"] = time.process_time() - c0
        if prof is not None:
            prof.dump_stats(str(profile_out))


class Driver:
    def __init__(self) -> None:
        self.client: sepp.Client | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self.stop = False

    def need_client(self) -> sepp.Client:
        if self.client is None:
            raise DriverError("send a 'connect' request first")
        return self.client

    async def op_ping(self, req: Request) -> Result:
        return {"pong": True, "loop": LOOP, "sepp_module": sepp.__file__, "pid": os.getpid()}

    async def op_connect(self, req: Request) -> Result:
        await self.op_close(req)
        stack = contextlib.AsyncExitStack()
        self.client = await stack.enter_async_context(sepp.open(req["addr"]))
        self._stack = stack
        return {"connected": True}

    async def op_close(self, req: Request) -> Result:
        stack, self._stack, self.client = self._stack, None, None
        if stack is not None:
            await stack.aclose()
        return {}

    async def op_get_server_info(self, req: Request) -> Result:
        info = await self.need_client().get_server_info()
        return {"version": info.server_version, "max_reserve_batch": info.max_reserve_batch}

    async def op_rss(self, req: Request) -> Result:
        max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"rss_bytes": max_rss, "max_rss_bytes": max_rss}

    async def op_shutdown(self, req: Request) -> Result:
        self.stop = True
        await self.op_close(req)
        return {}

    async def op_bench_enqueue(self, req: Request) -> Result:
        """n single enqueues across `concurrency` tasks on one client."""
        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        concurrency = max(1, int(req.get("concurrency", 1)))
        payload = _payload(int(req.get("payload_size", 0)))
        job_type = req.get("job_type", "bench")
        remaining = n

        async def producer() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await client.enqueue(queue, job_type, payload=payload)

        out: Result = {"n": n}
        with _measure(out, req):
            await asyncio.gather(*(producer() for _ in range(min(concurrency, max(n, 1)))))
        return out

    async def op_bench_drain_raw(self, req: Request) -> Result:
        """Reserve (max_jobs = free slots) + one ack task per job, at most `in_flight` jobs
        held at once. The queue must already hold `n` jobs."""
        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        in_flight = max(1, int(req.get("in_flight", 16)))
        lease_s = float(req.get("lease_s", 30))
        wait_s = float(req.get("wait_s", 1))
        timeout_s = float(req.get("timeout_s", 300))
        max_batch = (await client.get_server_info()).max_reserve_batch or in_flight

        free = in_flight
        slot_freed = asyncio.Event()
        failures: list[BaseException] = []
        acks: set[asyncio.Task[None]] = set()

        async def ack_one(job: sepp.Job) -> None:
            nonlocal free
            try:
                await client.ack(job.ctx)
            except Exception as exc:
                failures.append(exc)
            free += 1
            slot_freed.set()

        reserved = 0
        out: Result = {}
        deadline = time.perf_counter() + timeout_s
        with _measure(out, req):
            while reserved < n and not failures:
                while free <= 0:
                    await slot_freed.wait()
                    slot_freed.clear()
                if time.perf_counter() > deadline:
                    raise DriverError(f"bench_drain_raw timed out after {reserved}/{n} jobs")
                k = min(free, n - reserved, max_batch)
                free -= k
                jobs = await client.reserve(
                    [queue], lease_duration=lease_s, wait_timeout=wait_s, max_jobs=k
                )
                got = len(jobs) if jobs else 0
                free += k - got
                reserved += got
                for job in jobs or ():
                    task = asyncio.ensure_future(ack_one(job))
                    acks.add(task)
                    task.add_done_callback(acks.discard)
            if acks:
                await asyncio.gather(*acks)
        if failures:
            raise failures[0]
        out["n"] = reserved
        return out

    async def op_bench_drain_worker(self, req: Request) -> Result:
        """sepp.Worker with a catch-all handler that just returns, shut down after the n-th
        handler; run() then settles the in-flight acks (the trio driver's, on asyncio)."""
        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        kwargs: dict[str, Any] = {}
        if req.get("auto_extend") is not None:
            kwargs["auto_extend"] = bool(req["auto_extend"])
        worker = sepp.Worker(
            client,
            queues=[queue],
            lease_duration=float(req.get("lease_s", 30)),
            max_in_flight=int(req.get("max_in_flight", 16)),
            wait_timeout=float(req.get("wait_s", 5)),
            **kwargs,
        )
        done = 0

        async def handler(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            nonlocal done
            done += 1
            if done >= n:
                worker.shutdown()

        worker.catch_all(handler)
        out: Result = {}
        with _measure(out, req):
            try:
                await asyncio.wait_for(worker.run(), float(req.get("timeout_s", 300)))
            except asyncio.TimeoutError:
                raise DriverError(f"bench_drain_worker timed out after {done}/{n} jobs") from None
        out["n"] = done
        return out

    async def op_bench_latency(self, req: Request) -> Result:
        """Sequential enqueue -> handler-start latency with a running Worker (the Worker on
        asyncio), timed from just before `enqueue` to the first line of the handler: the trio
        driver's bench_latency."""
        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        warmup = int(req.get("warmup", 0))
        per_job_timeout = float(req.get("timeout_s", 10))
        payload = _payload(int(req.get("payload_size", 16)))
        worker = sepp.Worker(
            client,
            queues=[queue],
            lease_duration=float(req.get("lease_s", 30)),
            max_in_flight=int(req.get("max_in_flight", 16)),
            wait_timeout=float(req.get("wait_s", 30)),
        )
        arrived: dict[str, asyncio.Future[float]] = {}

        async def handler(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            t = time.perf_counter()
            key = ctx.custom.get("lat_key")
            if isinstance(key, str) and key in arrived and not arrived[key].done():
                arrived[key].set_result(t)

        worker.catch_all(handler)
        samples: list[float] = []
        running = asyncio.ensure_future(worker.run())
        try:
            await worker.wait_until_reserving()
            await asyncio.sleep(0.05)  # let the worker park its first reserve
            loop = asyncio.get_running_loop()
            for i in range(warmup + n):
                key = f"lat-{os.getpid()}-{i}"
                arrived[key] = reached = loop.create_future()
                t0 = time.perf_counter()
                await client.enqueue(queue, "latency", payload=payload, custom={"lat_key": key})
                try:
                    t1 = await asyncio.wait_for(reached, per_job_timeout)
                except asyncio.TimeoutError:
                    raise DriverError(f"job {i} never reached the handler") from None
                finally:
                    del arrived[key]
                if i >= warmup:
                    samples.append((t1 - t0) * 1000.0)
        finally:
            worker.shutdown()
            await running
        s = sorted(samples)
        return {
            "p50_ms": _percentile(s, 50),
            "p99_ms": _percentile(s, 99),
            "mean_ms": sum(s) / len(s) if s else float("nan"),
            "n": len(s),
        }


def _percentile(sorted_vals: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (as the other drivers compute it)."""
    if not sorted_vals:
        return float("nan")
    k = max(1, math.ceil(p / 100.0 * len(sorted_vals)))
    return sorted_vals[min(k, len(sorted_vals)) - 1]


def _encode_error(exc: BaseException) -> Result:
    err: Result = {"type": type(exc).__name__, "message": str(exc)}
    if not isinstance(exc, (sepp.SeppError, DriverError)):
        err["traceback"] = "".join(traceback.format_exception(exc))[-4000:]
    return err


async def amain() -> int:
    proto_out = os.dup(1)  # only protocol lines on the real stdout
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def write(obj: Result) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode("utf-8") + b"\n"
        while data:
            data = data[os.write(proto_out, data) :]

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    driver = Driver()
    try:
        while not driver.stop:
            line = await reader.readline()
            if not line:
                break
            if not line.strip():
                continue
            rid: object = None
            try:
                req = json.loads(line)
                rid = req.get("id")
                op = req.get("op")
                fn: Callable[[Request], Awaitable[Any]] | None = (
                    getattr(driver, f"op_{op}", None) if isinstance(op, str) else None
                )
                if fn is None:
                    raise DriverError(f"unknown op {op!r}")
                write({"id": rid, "ok": True, "result": await fn(req)})
            except Exception as exc:
                write({"id": rid, "ok": False, "error": _encode_error(exc)})
    finally:
        await driver.op_close({})
    return 0


if __name__ == "__main__":
    if LOOP == "uvloop":
        import uvloop

        raise SystemExit(uvloop.run(amain()))
    raise SystemExit(asyncio.run(amain()))
