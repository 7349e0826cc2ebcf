"""The Worker's drain on trio, asyncio and uvloop side by side, with sepp-py's Worker and
(optionally) another checkout's trio Worker, against one real server in one run.

    python -m benchmarks.worker_loops [--rounds 5] [--n 6000] [--baseline-src DIR]
                                      [--seppy-python PY] [--only WORD ...]

Each client drains its own queue of `n` jobs (enqueued beforehand, not measured) with a
Worker of `max_in_flight=64`, `auto_extend` off and a handler that just returns (the
`drain_worker_noext` scenario of `python -m benchmarks`), in its own process, timed from
`run()` to its return: wall time and that process's CPU. The clients take turns within each
round, in an order rotated every round; the table gives medians over the rounds.

trio: `benchmarks/trio_driver.py` (this checkout's src, or `--baseline-src`'s); sepp-py:
`tests/peers/seppy_driver.py` in its virtualenv (scripts/ensure-seppy-venv.sh); asyncio and
uvloop: `benchmarks/asyncio_driver.py` (`--loop`), the same op on sepp-trio's asyncio client.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRIO_DRIVER = REPO / "benchmarks" / "trio_driver.py"
ASYNCIO_DRIVER = REPO / "benchmarks" / "asyncio_driver.py"
SEPPY_DRIVER = REPO / "tests" / "peers" / "seppy_driver.py"
MAX_IN_FLIGHT = 64
LEASE_S = 30.0
WAIT_S = 5.0


def drive_json_lines(argv: list[str], requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run a JSON-lines driver (trio_driver.py, seppy_driver.py) through `requests`."""
    process = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env()
    )
    assert process.stdin is not None and process.stdout is not None
    answers = []
    try:
        for n, request in enumerate(requests):
            process.stdin.write(json.dumps({**request, "id": n}) + "\n")
            process.stdin.flush()
            answer = json.loads(process.stdout.readline())
            if not answer.get("ok"):
                raise RuntimeError(f"{argv[1]}: {answer}")
            answers.append(answer["result"])
    finally:
        process.stdin.close()
        process.wait(timeout=60)
    return answers


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}


def drain_request(queue: str, n: int) -> dict[str, Any]:
    return {
        "op": "bench_drain_worker",
        "queue": queue,
        "n": n,
        "max_in_flight": MAX_IN_FLIGHT,
        "lease_s": LEASE_S,
        "wait_s": WAIT_S,
        "auto_extend": False,
    }


def run_trio(src: Path, address: str, queue: str, n: int) -> dict[str, Any]:
    argv = [sys.executable, str(TRIO_DRIVER), "--no-otel", "--src", str(src)]
    return drive_json_lines(argv, [{"op": "connect", "addr": address}, drain_request(queue, n)])[1]


def run_seppy(python: str, address: str, queue: str, n: int) -> dict[str, Any]:
    argv = [python, "-I", str(SEPPY_DRIVER), "--no-otel"]
    connect = {"op": "connect", "addr": address}
    return drive_json_lines(argv, [connect, drain_request(queue, n)])[1]


def run_asyncio(loop: str, src: Path, address: str, queue: str, n: int) -> dict[str, Any]:
    argv = [sys.executable, str(ASYNCIO_DRIVER), "--loop", loop, "--no-otel", "--src", str(src)]
    return drive_json_lines(argv, [{"op": "connect", "addr": address}, drain_request(queue, n)])[1]


async def fill(address: str, queue: str, n: int) -> None:
    import sepp

    async with sepp.open(address) as client:
        for start in range(0, n, 500):
            batch = [
                sepp.EnqueueRequest(queue, "bench", payload=sepp.Payload.bytes(b"x" * 64))
                for _ in range(min(500, n - start))
            ]
            await client.enqueue_batch(batch)


def harness(a: argparse.Namespace) -> int:
    import trio

    from sepp.testing import sepp_server

    clients: dict[str, Any] = {
        "sepp-trio (trio)": lambda addr, q: run_trio(REPO / "src", addr, q, a.n),
        "sepp-trio (asyncio)": lambda addr, q: run_asyncio("asyncio", REPO / "src", addr, q, a.n),
        "sepp-trio (uvloop)": lambda addr, q: run_asyncio("uvloop", REPO / "src", addr, q, a.n),
    }
    if a.baseline_src:
        src = Path(a.baseline_src)
        clients["sepp-trio (trio, baseline)"] = lambda addr, q: run_trio(src, addr, q, a.n)
    if a.seppy_python:
        clients["sepp-py"] = lambda addr, q: run_seppy(a.seppy_python, addr, q, a.n)
    if a.only:
        clients = {name: run for name, run in clients.items() if any(w in name for w in a.only)}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in clients}

    async def main() -> None:
        config = {"storage": {"persist_mode": "buffer"}}
        async with sepp_server(config) as server:
            names = list(clients)
            for round_no in range(a.rounds):
                order = names[round_no % len(names) :] + names[: round_no % len(names)]
                for name in order:
                    queue = f"bench-{len(results[name])}-{abs(hash(name)) % 10_000}"
                    await fill(server.address, queue, a.n)
                    result = await trio.to_thread.run_sync(clients[name], server.address, queue)
                    assert result["n"] == a.n, result
                    results[name].append(result)
                    print(f"round {round_no + 1} {name}: {result}", file=sys.stderr)

    trio.run(main)
    print(
        f"\nWorker drain, {a.n} jobs, max_in_flight {MAX_IN_FLIGHT}, auto_extend off;"
        f" medians of {a.rounds} rounds"
    )
    print("| client | jobs/s | CPU µs/job |")
    print("|---|---|---|")
    for name, runs in results.items():
        rate = statistics.median(a.n / r["elapsed_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] / a.n * 1e6 for r in runs)
        print(f"| {name} | {rate:,.0f} | {cpu:.0f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.worker_loops")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=6000)
    p.add_argument("--baseline-src", default=None, help="another checkout's src/ (trio only)")
    p.add_argument("--seppy-python", default=None, help="the sepp-py virtualenv's python")
    p.add_argument(
        "--only", nargs="+", metavar="WORD", help="only the clients whose names hold a WORD"
    )
    a = p.parse_args(argv)
    return harness(a)


if __name__ == "__main__":
    raise SystemExit(main())
