"""Blocking clients side by side: `sepp.SyncClient` against grpcio's own blocking unary call
(a sync `grpc.insecure_channel` with sepp-py's generated stub), and SyncClient's previous
design (the trio client on a thread of its own), on one real server: sequential single-job
enqueues from 1 thread and from 16 threads sharing one client. Each run is a fresh driver
process (benchmarks/blocking_driver.py); clients alternate, in an order that rotates every
round, and ratios are the median of per-round ratios. See benchmarks/README.md, "Blocking clients".

    .venv/bin/python -m benchmarks.blocking [--rounds 5] [--jobs 2000] [--update-readme]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Any

import trio

from ._drivers import BENCH_DIR, REPO, SRC, _clean_env, replace_marked, results_header, run_json

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import sepp.testing

DRIVER = BENCH_DIR / "blocking_driver.py"
README = BENCH_DIR / "README.md"
START, END = "<!-- blocking-results:start -->", "<!-- blocking-results:end -->"
CLIENTS = ("sepp-trio", "grpcio", "trio-portal")
THREADS = (1, 16)
CONFIG = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}


def seppy_python() -> str:
    if os.environ.get("SEPPY_PYTHON"):
        return os.environ["SEPPY_PYTHON"]
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "ensure-seppy-venv.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


async def measure(rounds: int, jobs: int) -> list[dict[str, Any]]:
    pythons = {c: sys.executable for c in CLIENTS} | {"grpcio": seppy_python()}
    rows: list[dict[str, Any]] = []
    async with sepp.testing.sepp_server(CONFIG) as server:
        for index in range(rounds):
            for threads in THREADS:
                shift = index % len(CLIENTS)
                for client in CLIENTS[shift:] + CLIENTS[:shift]:
                    queue = f"blocking-{index}-{threads}-{client}"
                    argv = [pythons[client], str(DRIVER), client, server.address, queue]
                    result = await run_json([*argv, str(jobs), str(threads)], _clean_env())
                    rows.append({"round": index, **result})
                    print(f"round {index} {threads:>2} threads {client}: {result}", file=sys.stderr)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def median(client: str, threads: int, key: str) -> float:
        return statistics.median(
            r[key] for r in rows if r["client"] == client and r["threads"] == threads
        )

    def ratio(client: str, threads: int) -> float:
        by_round: dict[int, dict[str, float]] = {}
        for r in rows:
            if r["threads"] == threads:
                by_round.setdefault(r["round"], {})[r["client"]] = r["ops_s"]
        return statistics.median(v[client] / v["grpcio"] for v in by_round.values())

    head = (
        "| enqueue, blocking | sepp-trio SyncClient ops/s | grpcio blocking ops/s |"
        " trio portal ops/s | SyncClient / grpcio | portal / grpcio |"
        " SyncClient CPU ms/call | grpcio CPU ms/call | portal CPU ms/call |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {threads} thread{'s' if threads > 1 else ''}, one shared client"
        f" | {median('sepp-trio', threads, 'ops_s'):,.0f}"
        f" | {median('grpcio', threads, 'ops_s'):,.0f}"
        f" | {median('trio-portal', threads, 'ops_s'):,.0f}"
        f" | {ratio('sepp-trio', threads):.2f} | {ratio('trio-portal', threads):.2f}"
        f" | {median('sepp-trio', threads, 'cpu_ms_per_call'):.3f}"
        f" | {median('grpcio', threads, 'cpu_ms_per_call'):.3f}"
        f" | {median('trio-portal', threads, 'cpu_ms_per_call'):.3f} |"
        for threads in THREADS
    ]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.blocking")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2000, help="calls per run")
    parser.add_argument("--update-readme", action="store_true")
    opts = parser.parse_args()
    rows = trio.run(measure, opts.rounds, opts.jobs)
    text = results_header(
        f"{opts.rounds} rounds of {opts.jobs} calls per client and scenario, `persist_mode=buffer`",
        f"python -m benchmarks.blocking --rounds {opts.rounds} --jobs {opts.jobs} --update-readme",
    ) + table(rows)
    print(text)
    if opts.update_readme:
        replace_marked(README, START, END, text)


if __name__ == "__main__":
    main()
