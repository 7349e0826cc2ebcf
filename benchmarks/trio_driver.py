"""JSON-lines benchmark driver for sepp-trio: the twin of tests/peers/seppy_driver.py.

The harness runs each client as its own process so that both are measured the same way: wall
time around the measured loop and CPU from that process's own ``time.process_time()``. This
driver speaks the same protocol and implements the same ``bench_*`` ops with the same
semantics as the sepp-py driver (see tests/peers/README.md), on trio and sepp-trio.

    python benchmarks/trio_driver.py [--no-otel] [--src DIR]

``--no-otel`` makes ``opentelemetry`` unimportable before ``import sepp`` (sepp-trio then takes
its no-OTel paths, like sepp-py's driver with the same flag). ``--src DIR`` puts DIR first on
``sys.path`` so the checkout's ``src/sepp`` is measured, not an installed copy.

Every ``bench_*`` op also takes ``profile_out``: the path to write cProfile stats of the measured
region to (``python -m benchmarks.profiling`` uses it).
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


# This script's own directory (benchmarks/) must not shadow anything (e.g. stdlib modules).
if sys.path and sys.path[0].rstrip("/").endswith("benchmarks"):
    del sys.path[0]
if "--no-otel" in _ARGS:
    sys.meta_path.insert(0, _BlockOtel())
if "--src" in _ARGS:
    sys.path.insert(0, _ARGS[_ARGS.index("--src") + 1])
_OPEN_OPTIONS: dict[str, Any] = {}
if "--experiment" in _ARGS:  # what-if patches (benchmarks/experiments.py), before import sepp
    import os.path

    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import experiments

    experiments.apply(_ARGS[_ARGS.index("--experiment") + 1])
    _OPEN_OPTIONS.update(experiments.OPEN_OPTIONS)

import contextlib  # noqa: E402
import cProfile  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import AsyncIterator, Awaitable, Callable  # noqa: E402

import trio  # noqa: E402

import sepp  # noqa: E402

Request = dict[str, Any]
Result = dict[str, Any]


class DriverError(Exception):
    """A problem with the request itself, or a bench run that went wrong."""


def _percentile(sorted_vals: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (as the sepp-py driver computes it)."""
    if not sorted_vals:
        return float("nan")
    k = max(1, math.ceil(p / 100.0 * len(sorted_vals)))
    return sorted_vals[min(k, len(sorted_vals)) - 1]


def _rss() -> Result:
    rss = None
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rss_bytes": rss if rss is not None else max_rss, "max_rss_bytes": max_rss}


def _payload(size: int) -> sepp.Payload | None:
    return sepp.Payload(b"x" * size, "application/octet-stream") if size > 0 else None


@contextlib.contextmanager
def _measure(req: Request, out: Result) -> Any:
    """Time the block: wall (perf_counter) and this process's CPU; optionally cProfile it."""
    profile_out = req.get("profile_out")
    prof = cProfile.Profile() if profile_out else None
    c0, t0 = time.process_time(), time.perf_counter()
    if prof is not None:
        prof.enable()
    try:
        yield
    finally:
        if prof is not None:
            prof.disable()
        t1, c1 = time.perf_counter(), time.process_time()
        out["elapsed_s"] = t1 - t0
        out["cpu_s"] = c1 - c0
        if prof is not None:
            prof.dump_stats(str(profile_out))


class Driver:
    def __init__(self) -> None:
        self.client: sepp.Client | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._addr = ""
        self.stop = False

    def need_client(self) -> sepp.Client:
        if self.client is None:
            raise DriverError("send a 'connect' request first")
        return self.client

    # -- basic ops ------------------------------------------------------------------------

    async def op_ping(self, req: Request) -> Result:
        import google.protobuf
        import h2
        import hpack
        from google.protobuf.internal import api_implementation

        return {
            "pong": True,
            "sepp_trio_version": sepp.__version__,
            "sepp_module": sepp.__file__,
            "python": sys.version.split()[0],
            "executable": sys.executable,
            "h2": h2.__version__,
            "hpack": hpack.__version__,
            "trio": trio.__version__,
            "protobuf": google.protobuf.__version__,
            "protobuf_impl": api_implementation.Type(),
            "otel_api": "opentelemetry" in sys.modules,
            "experiments": _ARGS[_ARGS.index("--experiment") + 1]
            if "--experiment" in _ARGS
            else "",
            "pid": os.getpid(),
            "connected": self.client is not None,
        }

    async def op_connect(self, req: Request) -> Result:
        await self.op_close(req)
        stack = contextlib.AsyncExitStack()
        self.client = await stack.enter_async_context(sepp.open(req["addr"], **_OPEN_OPTIONS))
        self._stack = stack
        self._addr = req["addr"]
        return {"connected": True}

    async def op_close(self, req: Request) -> Result:
        stack, self._stack, self.client = self._stack, None, None
        if stack is not None:
            await stack.aclose()
        return {}

    async def op_get_server_info(self, req: Request) -> Result:
        info = await self.need_client().get_server_info()
        return {
            "version": info.server_version,
            "max_reserve_batch": info.max_reserve_batch,
            "max_enqueue_batch": info.max_enqueue_batch,
        }

    async def op_rss(self, req: Request) -> Result:
        return _rss()

    async def op_shutdown(self, req: Request) -> Result:
        self.stop = True
        await self.op_close(req)
        return {}

    # -- benchmarks -----------------------------------------------------------------------

    async def op_bench_enqueue(self, req: Request) -> Result:
        """n single enqueues across `concurrency` tasks on one client; with `auto_batch`, on a
        client opened with sepp.Batching() (the other clients ignore the flag)."""
        if req.get("auto_batch"):
            async with sepp.open(
                self._addr, enqueue_batching=sepp.Batching(), **_OPEN_OPTIONS
            ) as batching:
                await batching.get_server_info()  # connect and fetch limits outside the timing
                return await self._bench_enqueue(batching, req)
        return await self._bench_enqueue(self.need_client(), req)

    async def _bench_enqueue(self, client: sepp.Client, req: Request) -> Result:
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
        with _measure(req, out):
            async with trio.open_nursery() as nursery:
                for _ in range(min(concurrency, max(n, 1))):
                    nursery.start_soon(producer)
        return out

    async def op_bench_enqueue_batch(self, req: Request) -> Result:
        client = self.need_client()
        queue = req["queue"]
        n_batches, batch_size = int(req["n_batches"]), int(req["batch_size"])
        concurrency = max(1, int(req.get("concurrency", 1)))
        payload = _payload(int(req.get("payload_size", 0)))
        job_type = req.get("job_type", "bench")
        remaining = n_batches
        rejected = 0

        async def producer() -> None:
            nonlocal remaining, rejected
            while remaining > 0:
                remaining -= 1
                batch = [
                    sepp.EnqueueRequest(queue, job_type, payload=payload) for _ in range(batch_size)
                ]
                results = await client.enqueue_batch(batch)
                rejected += sum(sepp.is_job_rejection(r) for r in results)

        out: Result = {"n": n_batches * batch_size}
        with _measure(req, out):
            async with trio.open_nursery() as nursery:
                for _ in range(min(concurrency, max(n_batches, 1))):
                    nursery.start_soon(producer)
        if rejected:
            raise DriverError(f"{rejected} job(s) were rejected during bench_enqueue_batch")
        return out

    async def op_bench_outbox_relay(self, req: Request) -> Result:
        """`sepp.OutboxRelay` (a trio task, batches of `batch_size`) forwarding `n` rows of a
        fresh sqlite3 file, written beforehand (untimed), until all are relayed. The relay's
        database calls run in threads of this process, so their CPU counts too."""
        import sqlite3
        import tempfile

        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        payload = _payload(int(req.get("payload_size", 0)))
        with tempfile.TemporaryDirectory(prefix="sepp-bench-outbox-") as tmp:
            path = os.path.join(tmp, "outbox.db")
            db = sqlite3.connect(path)
            outbox = sepp.Outbox()
            outbox.create_table(db)
            with db:
                for _ in range(n):
                    outbox.add(db, queue, "bench", payload=payload)
            db.close()
            relay = sepp.OutboxRelay(f"sqlite:///{path}", batch_size=int(req["batch_size"]))
            out: Result = {"n": n}
            async with trio.open_nursery() as nursery:
                with _measure(req, out):
                    await nursery.start(relay.run, client)
                    while relay.counters.relayed < n:  # noqa: ASYNC110 (counters, no event)
                        await trio.sleep(0.002)
                relay.shutdown()
        if relay.counters.rejected:
            raise DriverError(f"{relay.counters.rejected} row(s) were rejected by the server")
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
        slot_freed = trio.Event()
        failures: list[BaseException] = []

        async def ack_one(job: sepp.Job) -> None:
            nonlocal free, slot_freed
            try:
                await client.ack(job.ctx)
            except Exception as exc:
                failures.append(exc)
            free += 1
            slot_freed.set()

        reserved = 0
        out: Result = {}
        with _measure(req, out), trio.move_on_after(timeout_s) as scope:
            async with trio.open_nursery() as nursery:
                while reserved < n and not failures:
                    while free <= 0:
                        await slot_freed.wait()
                        slot_freed = trio.Event()
                    k = min(free, n - reserved, max_batch)
                    free -= k
                    jobs = await client.reserve(
                        [queue], lease_duration=lease_s, wait_timeout=wait_s, max_jobs=k
                    )
                    got = len(jobs) if jobs else 0
                    free += k - got
                    reserved += got
                    for job in jobs or ():
                        nursery.start_soon(ack_one, job)
        if scope.cancelled_caught:
            raise DriverError(f"bench_drain_raw timed out after {reserved}/{n} jobs")
        if failures:
            raise failures[0]
        out["n"] = reserved
        return out

    async def op_bench_drain_worker(self, req: Request) -> Result:
        """sepp.Worker with a catch-all handler that just returns, shut down after the n-th
        handler; run() then settles the in-flight acks."""
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
        with _measure(req, out), trio.move_on_after(float(req.get("timeout_s", 300))) as scope:
            await worker.run()
        if scope.cancelled_caught:
            raise DriverError(f"bench_drain_worker timed out after {done}/{n} jobs")
        out["n"] = done
        return out

    async def op_bench_latency(self, req: Request) -> Result:
        """Sequential enqueue -> handler-start latency with a running Worker, timed from just
        before `enqueue` to the first line of the handler."""
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
        waiting: dict[str, list[float]] = {}
        arrived: dict[str, trio.Event] = {}

        async def handler(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            t = time.perf_counter()
            key = ctx.custom.get("lat_key")
            if isinstance(key, str) and key in arrived:
                waiting[key].append(t)
                arrived[key].set()

        worker.catch_all(handler)
        samples: list[float] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            try:
                await trio.sleep(0.05)  # let the worker park its first reserve
                for i in range(warmup + n):
                    key = f"lat-{os.getpid()}-{i}"
                    waiting[key], arrived[key] = [], trio.Event()
                    t0 = time.perf_counter()
                    await client.enqueue(queue, "latency", payload=payload, custom={"lat_key": key})
                    with trio.move_on_after(per_job_timeout):
                        await arrived[key].wait()
                    if not waiting[key]:
                        raise DriverError(f"job {i} never reached the handler")
                    t1 = waiting.pop(key)[0]
                    del arrived[key]
                    if i >= warmup:
                        samples.append((t1 - t0) * 1000.0)
            finally:
                worker.shutdown()
        s = sorted(samples)
        out: Result = {
            "p50_ms": _percentile(s, 50),
            "p99_ms": _percentile(s, 99),
            "mean_ms": sum(s) / len(s) if s else float("nan"),
            "min_ms": s[0] if s else float("nan"),
            "max_ms": s[-1] if s else float("nan"),
            "n": len(s),
        }
        if req.get("return_samples"):
            out["samples_ms"] = samples
        return out


def _encode_error(exc: BaseException) -> Result:
    err: Result = {"type": type(exc).__name__, "message": str(exc)}
    if not isinstance(exc, (sepp.SeppError, DriverError)):
        err["traceback"] = "".join(traceback.format_exception(exc))[-4000:]
    return err


async def _lines(stream: trio.abc.ReceiveStream) -> AsyncIterator[bytes]:
    pending = b""
    while True:
        chunk = await stream.receive_some(1 << 16)
        if not chunk:
            if pending.strip():
                yield pending
            return
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line


async def amain() -> int:
    # Only protocol lines on the real stdout; anything else that writes to fd 1 goes to stderr.
    proto_out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def write(obj: Result) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode("utf-8") + b"\n"
        while data:
            data = data[os.write(proto_out, data) :]

    driver = Driver()
    stdin = trio.lowlevel.FdStream(os.dup(0))
    try:
        async for line in _lines(stdin):
            rid: object = None
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise DriverError("a request must be a JSON object")
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
            if driver.stop:
                break
    finally:
        await driver.op_close({})
        await stdin.aclose()
    return 0


if __name__ == "__main__":
    raise SystemExit(trio.run(amain))
