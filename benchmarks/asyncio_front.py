"""The asyncio front end side by side: sepp-trio under asyncio (default loop and uvloop), the
same client under trio, and sepp-py (grpc.aio), one real server, same run. Each client is a
JSON-lines driver process (benchmarks/asyncio_driver.py, trio_driver.py, sepp-py's
tests/peers/seppy_driver.py), the order rotating every round; ratios are medians of per-round
ratios. See benchmarks/README.md, "The asyncio front end".

    .venv/bin/python -m benchmarks.asyncio_front [--rounds 3] [--size 1.0] [--update-readme]

Scenarios: `enqueue_64` (single-job enqueues from 64 tasks on one client), `drain` (reserve,
max_jobs = free slots of 64, plus one ack task per job, on a preloaded queue), `enqueue_1`
(single enqueues one after the other: its mean round trip, as every driver can time it alike).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from ._drivers import (
    BENCH_DIR,
    SRC,
    ClientSpec,
    DriverProcess,
    _clean_env,
    replace_marked,
    results_header,
    seppy_spec,
    trio_spec,
)
from .blocking import seppy_python

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import sepp
import sepp.testing

from .runner import preload

README = BENCH_DIR / "README.md"
START, END = "<!-- asyncio-results:start -->", "<!-- asyncio-results:end -->"
DRIVER = BENCH_DIR / "asyncio_driver.py"
CONFIG = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}
PAYLOAD_SIZE = 256
CLIENTS = ("asyncio", "uvloop", "trio", "sepp-py")


def asyncio_spec(python: str, loop: str) -> ClientSpec:
    argv = [python, str(DRIVER), "--loop", loop, "--no-otel", "--src", str(SRC)]
    return ClientSpec(loop, argv, None, _clean_env())


def specs() -> dict[str, ClientSpec]:
    return {
        "asyncio": asyncio_spec(sys.executable, "asyncio"),
        "uvloop": asyncio_spec(sys.executable, "uvloop"),
        "trio": trio_spec(sys.executable, otel=False),
        "sepp-py": seppy_spec(seppy_python(), otel=False),
    }


def scenarios(size: float) -> dict[str, tuple[str, dict[str, Any]]]:
    def n(base: int) -> int:
        return max(50, int(base * size))

    return {
        "enqueue_64": (
            "bench_enqueue",
            {"n": n(6000), "concurrency": 64, "payload_size": PAYLOAD_SIZE},
        ),
        "drain": ("bench_drain_raw", {"n": n(6000), "in_flight": 64, "lease_s": 60, "wait_s": 1}),
        "enqueue_1": (
            "bench_enqueue",
            {"n": n(2000), "concurrency": 1, "payload_size": PAYLOAD_SIZE},
        ),
        # The main table's latency: enqueue -> handler start, one job at a time, each client's
        # own Worker (on asyncio, sepp-trio's Worker on anyio).
        "latency": (
            "bench_latency",
            {"n": n(300), "warmup": 20, "payload_size": 16, "max_in_flight": 16},
        ),
    }


async def measure(rounds: int, size: float, logs: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    client_specs = specs()
    async with sepp.testing.sepp_server(CONFIG) as server, sepp.open(server.address) as loader:
        drivers = {}
        for name in CLIENTS:
            driver = DriverProcess(client_specs[name], logs / f"{name}.log")
            await driver.start()
            await driver.request("connect", addr=server.address)
            drivers[name] = driver
        try:
            for name, driver in drivers.items():  # warm-up, untimed
                for scenario, (op, args) in scenarios(0.05).items():
                    queue = f"warm-{name}-{scenario}"
                    if op == "bench_drain_raw":
                        await preload(loader, queue, args["n"], 256)
                    await driver.request(op, queue=queue, **args)
            for index in range(rounds):
                shift = index % len(CLIENTS)
                for name in CLIENTS[shift:] + CLIENTS[:shift]:
                    for scenario, (op, args) in scenarios(size).items():
                        queue = f"aio-{index}-{name}-{scenario}"
                        if op == "bench_drain_raw":
                            await preload(loader, queue, args["n"], 256)
                        result = await drivers[name].request(op, queue=queue, **args)
                        row = {"round": index, "client": name, "scenario": scenario, **result}
                        rows.append(row)
                        print(f"round {index} {name} {scenario}: {result}", file=sys.stderr)
        finally:
            for driver in drivers.values():
                await driver.aclose()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def values(client: str, scenario: str, key: str) -> dict[int, float]:
        out = {}
        for r in rows:
            if r["client"] == client and r["scenario"] == scenario:
                if key == "p50_ms":
                    out[r["round"]] = r["p50_ms"]
                    continue
                n, elapsed, cpu = r["n"], r["elapsed_s"], r["cpu_s"]
                out[r["round"]] = {
                    "ops_s": n / elapsed,
                    "cpu_us": cpu / n * 1e6,
                    "ms": elapsed / n * 1e3,
                }[key]
        return out

    def median(client: str, scenario: str, key: str) -> float:
        return statistics.median(values(client, scenario, key).values())

    def ratio(client: str, other: str, scenario: str, key: str) -> str:
        mine, theirs = values(client, scenario, key), values(other, scenario, key)
        per_round = [mine[i] / theirs[i] for i in mine if i in theirs]
        return f"{statistics.median(per_round):.2f} ({min(per_round):.2f}-{max(per_round):.2f})"

    head = (
        "| client | enqueue, 64 tasks ops/s | drain ops/s | CPU µs per enqueue (64 tasks)"
        " | enqueue round trip ms (1 task) | enqueue -> handler p50 ms (Worker)"
        " | enqueue / sepp-py | drain / sepp-py | CPU / sepp-py | round trip / sepp-py"
        " | p50 / sepp-py | enqueue / trio | drain / trio |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for client in CLIENTS:
        lines.append(
            f"| {client if client != 'trio' else 'trio (sepp-trio)'}"
            f" | {median(client, 'enqueue_64', 'ops_s'):,.0f}"
            f" | {median(client, 'drain', 'ops_s'):,.0f}"
            f" | {median(client, 'enqueue_64', 'cpu_us'):.0f}"
            f" | {median(client, 'enqueue_1', 'ms'):.3f}"
            f" | {median(client, 'latency', 'p50_ms'):.3f}"
            f" | {ratio(client, 'sepp-py', 'enqueue_64', 'ops_s')}"
            f" | {ratio(client, 'sepp-py', 'drain', 'ops_s')}"
            f" | {ratio(client, 'sepp-py', 'enqueue_64', 'cpu_us')}"
            f" | {ratio(client, 'sepp-py', 'enqueue_1', 'ms')}"
            f" | {ratio(client, 'sepp-py', 'latency', 'p50_ms')}"
            f" | {ratio(client, 'trio', 'enqueue_64', 'ops_s')}"
            f" | {ratio(client, 'trio', 'drain', 'ops_s')} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.asyncio_front")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=float, default=1.0, help="scale the job counts")
    parser.add_argument("--update-readme", action="store_true")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as logs:
        rows = trio.run(measure, opts.rounds, opts.size, Path(logs))
    command = f"python -m benchmarks.asyncio_front --rounds {opts.rounds} --size {opts.size:g}"
    text = results_header(
        f"{opts.rounds} rounds, `persist_mode=buffer`, 256-byte payloads", command
    ) + table(rows)
    print(text)
    if opts.update_readme:
        replace_marked(README, START, END, text)


if __name__ == "__main__":
    main()
