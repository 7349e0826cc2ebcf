"""The "every core" section of `make bench`: jobs/s of CPU-bound `def` handlers (a fixed amount
of pure-Python work, ~30 ms on CPython here: benchmarks/cores_app.py), one real server, the
`sepp-trio worker` command for real, as ratios per round:

- `processes`: `--processes 2` over `--processes 1`, on this CPython (with the GIL), one
  handler slot per process (`--max-in-flight 1`);
- `threads`: one process, `--max-in-flight 2` over 1 (handler threads), on the free-threaded
  py3.13t the matrix provisions (scripts/ensure-interpreters.sh; with a test-matrix virtualenv,
  or FREE_THREADED_PYTHON=path), and on this CPython for contrast (the GIL: about 1x).

Each run starts the command on an empty queue, waits until every process reserves, enqueues the
jobs and counts the handlers' "finished" log lines until all are done: jobs/s is jobs over that
time. The two runs of a ratio are seconds apart, their order flipping every round. Ratios on a
machine shared with other work are lower bounds of what the cores give.

    python -m benchmarks.cores [--rounds 3] [--jobs 200] [--work-ms 30] [--only processes]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio

from ._drivers import REPO, SRC, _clean_env

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import sepp
import sepp.testing

from .cores_app import burn

PARTS = ("processes", "threads")
TARGET = "benchmarks.cores_app:router"
CONFIG = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}
TIMEOUT_S = 600


def calibrate(work_ms: float) -> int:
    """Loop turns of cores_app.burn taking `work_ms` of CPU here (the median of 5 tries)."""
    turns = 100_000
    tries = []
    for _ in range(5):
        start = time.thread_time()
        burn({"turns": turns}, None)  # type: ignore[arg-type]
        tries.append(time.thread_time() - start)
    return int(turns * work_ms / 1000 / statistics.median(tries))


def free_threaded_python() -> str | None:
    explicit = os.environ.get("FREE_THREADED_PYTHON")
    if explicit:
        return explicit
    from .platforms import cached_interpreters

    return cached_interpreters().get("py3.13t")


async def jobs_per_second(
    python: str, address: str, queue: str, flags: Sequence[str], jobs: int, turns: int
) -> float:
    """Run the worker command with `flags` on `queue` until `jobs` jobs are done: jobs/s."""
    processes = int(flags[flags.index("--processes") + 1]) if "--processes" in flags else 1
    env = _clean_env({"PYTHONPATH": str(SRC)})
    argv = [python, "-m", "sepp", "--address", address, "worker", TARGET, "--queue", queue]
    process = await trio.lowlevel.open_process(
        [*argv, *flags], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    stderr = bytearray()
    changed = trio.Event()

    async def collect() -> None:
        nonlocal changed
        assert process.stderr is not None
        async for chunk in process.stderr:
            stderr.extend(chunk)
            changed.set()
            changed = trio.Event()

    async def until(fragment: bytes, count: int) -> None:
        while stderr.count(fragment) < count:
            if process.returncode is not None:
                raise RuntimeError(f"the worker exited: {stderr.decode()[-2000:]}")
            await changed.wait()

    try:
        with trio.fail_after(TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect)
                ready = b") is worker " if processes > 1 else b" reserving from "
                await until(ready, processes)
                async with sepp.open(address) as client:
                    payload = sepp.Payload.json({"turns": turns})
                    requests = [sepp.EnqueueRequest(queue, "burn", payload=payload)] * jobs
                    started = trio.current_time()
                    for at in range(0, jobs, 100):
                        await client.enqueue_batch(requests[at : at + 100])
                await until(b" finished: ack", jobs)
                elapsed = trio.current_time() - started
                process.send_signal(signal.SIGTERM)
                status = await process.wait()
                if status != 0:
                    raise RuntimeError(f"the worker exited {status}: {stderr.decode()[-2000:]}")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return jobs / elapsed


async def measure(
    rounds: int, jobs: int, work_ms: float, parts: Sequence[str] = PARTS
) -> dict[str, Any]:
    turns = calibrate(work_ms)
    # name -> (python, flags of the 1x run, flags of the 2x run)
    cases: dict[str, tuple[str, list[str], list[str]]] = {}
    base = ["--max-in-flight", "1"]
    if "processes" in parts:
        cases["processes, GIL"] = (sys.executable, base, [*base, "--processes", "2"])
    if "threads" in parts:
        free_threaded = free_threaded_python()
        if free_threaded is not None:
            cases["threads, py3.13t"] = (free_threaded, base, ["--max-in-flight", "2"])
        cases["threads, GIL"] = (sys.executable, base, ["--max-in-flight", "2"])
    out: dict[str, Any] = {
        "jobs": jobs,
        "work_ms": work_ms,
        "turns": turns,
        "python": sys.version.split()[0],
        "cases": {},
        "missing": [] if "threads" not in parts or free_threaded_python() else ["py3.13t"],
    }
    async with sepp.testing.sepp_server(CONFIG) as server:
        for name, (python, one, two) in cases.items():
            runs: list[dict[str, float]] = []
            for rnd in range(rounds):
                rates: dict[str, float] = {}
                order = [("1", one), ("2", two)]
                for label, flags in order if rnd % 2 == 0 else order[::-1]:
                    queue = f"cores.{len(out['cases'])}.r{rnd}.{label}"
                    rates[label] = await jobs_per_second(
                        python, server.address, queue, flags, jobs, turns
                    )
                runs.append(
                    {"one": rates["1"], "two": rates["2"], "ratio": rates["2"] / rates["1"]}
                )
                log(
                    f"{name} round {rnd + 1}/{rounds}: {rates['1']:.1f} -> {rates['2']:.1f}"
                    f" jobs/s, {runs[-1]['ratio']:.2f}x"
                )
            out["cases"][name] = {"python": python, "runs": runs}
    return out


def render(results: dict[str, Any]) -> str:
    lines = [
        f"### Every core: CPU-bound `def` handlers ({results['jobs']} jobs of"
        f" ~{results['work_ms']:g} ms pure-Python CPU each)",
        "",
        "| case | 1 | 2 | ratio (median, range over rounds) |",
        "|---|---|---|---|",
    ]
    for name, case in results["cases"].items():
        runs = case["runs"]
        ratios = [r["ratio"] for r in runs]
        lines.append(
            f"| {name} | {statistics.median(r['one'] for r in runs):.1f} jobs/s"
            f" | {statistics.median(r['two'] for r in runs):.1f} jobs/s"
            f" | {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    lines += [
        "",
        "processes: `--processes 2` over `--processes 1` (`--max-in-flight 1`); threads: one"
        " process, `--max-in-flight 2` over 1.",
    ]
    if results["missing"]:
        lines.append(
            f"Not measured: {', '.join(results['missing'])} (not provisioned: bash"
            " scripts/ensure-interpreters.sh py3.13t, then a test-matrix run, or"
            " FREE_THREADED_PYTHON=path)."
        )
    return "\n".join(lines)


def log(msg: str) -> None:
    print(f"[cores] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cores", description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--work-ms", type=float, default=30.0)
    p.add_argument("--only", choices=PARTS, action="append", help="one part (repeatable)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = trio.run(measure, args.rounds, args.jobs, args.work_ms, args.only or PARTS)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
