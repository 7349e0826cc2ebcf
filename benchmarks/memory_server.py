"""A user's test on the memory server and on the real one, in the same run: start a server,
enqueue `--jobs` jobs one call each, work them all through a `sepp.Worker` (burst mode: it
returns once the queue is drained), stop the server. Also what starting a memory server costs.

    python -m benchmarks.memory_server [--jobs 1000] [--rounds 5]

Per round, both, in alternating order: the test's wall time from the server's start to its
stop (what a test suite waits), this process's CPU (client and Worker, plus the memory
server when it is the one), and the real server process's own CPU. The real server runs as
`sepp.testing`'s `sepp_server` fixture starts it (`persist_mode = "buffer"`). The ratio is
memory over real, per round; the table gives its median and range. `make bench` runs this as
its "memory" section.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio

from ._drivers import REPO

if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

import sepp
import sepp.testing

REAL_CONFIG = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@asynccontextmanager
async def _real() -> AsyncIterator[str]:
    async with sepp.testing.sepp_server(REAL_CONFIG) as server:
        yield server.address


@asynccontextmanager
async def _memory() -> AsyncIterator[str]:
    async with sepp.testing.memory_server() as server:
        yield server.address


SERVERS: dict[str, Callable[[], AbstractAsyncContextManager[str]]] = {
    "memory": _memory,
    "real": _real,
}


async def user_test(address: str, jobs: int) -> None:
    """What a handler test does: enqueue, then work everything with a Worker."""
    handled = 0
    router = sepp.Router()

    @router.handler("send")
    async def send(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        nonlocal handled
        handled += 1

    async with sepp.open(address) as client:
        for n in range(jobs):
            await client.enqueue("emails", "send", payload=sepp.Payload.json(n))
        await sepp.Worker(client, "emails", handlers=router).run(until_idle=True)
    if handled != jobs:
        raise RuntimeError(f"{handled} of {jobs} jobs handled")


async def one_run(server: str, jobs: int) -> dict[str, float]:
    children = _children_cpu()
    cpu, wall = time.process_time(), time.perf_counter()
    async with SERVERS[server]() as address:
        await user_test(address, jobs)
    wall_s, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_s": wall_s, "cpu_s": cpu_s, "server_cpu_s": _children_cpu() - children}


async def startup_cpu(times: int = 9) -> float:
    """The median CPU seconds of entering `memory_server()` (listening, ready)."""
    costs = []
    for _ in range(times):
        before = time.process_time()
        async with sepp.testing.memory_server():
            costs.append(time.process_time() - before)
    return statistics.median(costs)


def blocking_startup_cpu(times: int = 9) -> float:
    """The median CPU seconds of `MemoryServer().start()` from blocking code (its thread
    started, listening, ready); its stop is not counted."""
    costs = []
    for _ in range(times):
        before = time.process_time()
        server = sepp.testing.MemoryServer().start()
        costs.append(time.process_time() - before)
        server.stop()
    return statistics.median(costs)


async def measure(rounds: int, jobs: int) -> dict[str, Any]:
    await one_run("memory", 50)  # warm both paths up (imports, first connections)
    await one_run("real", 50)
    runs: list[dict[str, dict[str, float]]] = []
    for index in range(rounds):
        order = ["memory", "real"] if index % 2 == 0 else ["real", "memory"]
        runs.append({server: await one_run(server, jobs) for server in order})
    return {
        "jobs": jobs,
        "runs": runs,
        "startup_cpu_s": await startup_cpu(),
        "blocking_startup_cpu_s": await trio.to_thread.run_sync(blocking_startup_cpu),
    }


def render(results: dict[str, Any]) -> str:
    runs = results["runs"]

    def median(server: str, key: str) -> float:
        return statistics.median(r[server][key] for r in runs)

    ratios = [r["memory"]["wall_s"] / r["real"]["wall_s"] for r in runs]
    lines = [
        f"### The memory server: a user's test ({results['jobs']:,} single enqueues, then a"
        " Worker until idle; the server's start and stop included)",
        "",
        "| server | wall (median) | memory / real (range over rounds) | this process's CPU"
        " | the server process's CPU |",
        "|---|---|---|---|---|",
        f"| memory | {median('memory', 'wall_s'):.3f} s"
        f" | {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        f" | {median('memory', 'cpu_s'):.3f} s | (in this process) |",
        f"| real (sepp 0.1.1, buffer) | {median('real', 'wall_s'):.3f} s | 1 |"
        f" {median('real', 'cpu_s'):.3f} s | {median('real', 'server_cpu_s'):.3f} s |",
        "",
        f"Starting a memory server: {results['startup_cpu_s'] * 1000:.1f} ms of CPU in a run"
        f" (`memory_server()`), {results['blocking_startup_cpu_s'] * 1000:.1f} ms from blocking"
        " code (`MemoryServer().start()`, a thread of its own): medians of nine.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_server", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(render(trio.run(measure, args.rounds, args.jobs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
