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
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
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


def thread_cpu(pids: Sequence[int]) -> dict[tuple[int, int], float]:
    """CPU seconds so far of every thread of the processes `pids` (Linux /proc), by (pid,
    thread id); a process's main thread (the event loop) has its pid as thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[tuple[int, int], float] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                fields = (task / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # the thread ended meanwhile
            out[(pid, int(task.name))] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cores_used(
    before: dict[tuple[int, int], float],
    after: dict[tuple[int, int], float],
    elapsed: float,
    jobs: int,
) -> dict[str, float]:
    """Cores busy over `elapsed`, in all and in the processes' main threads (the event
    loops), and the CPU each job cost (ms): where a second core goes that is not in the
    jobs/s. CPU per job barely moves with the machine's load, unlike jobs/s."""
    spent = {key: cpu - before.get(key, 0.0) for key, cpu in after.items()}
    total = sum(spent.values())
    loops = sum(cpu for (pid, tid), cpu in spent.items() if pid == tid)
    return {
        "cores": total / elapsed,
        "loop_cores": loops / elapsed,
        "cpu_ms_per_job": 1000 * total / jobs,
        "loop_ms_per_job": 1000 * loops / jobs,
    }


async def jobs_per_second(
    python: str, address: str, queue: str, flags: Sequence[str], jobs: int, turns: int
) -> dict[str, float]:
    """Run the worker command with `flags` on `queue` until `jobs` jobs are done: jobs/s, and
    the cores its processes kept busy meanwhile (all threads; the event loops alone)."""
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
                pids = [int(pid) for pid in re.findall(rb"started: pid (\d+)", stderr)]
                pids = pids or [process.pid]
                async with sepp.open(address) as client:
                    payload = sepp.Payload.json({"turns": turns})
                    requests = [sepp.EnqueueRequest(queue, "burn", payload=payload)] * jobs
                    cpu_before = thread_cpu(pids)
                    started = trio.current_time()
                    for at in range(0, jobs, 100):
                        await client.enqueue_batch(requests[at : at + 100])
                await until(b" finished: ack", jobs)
                elapsed = trio.current_time() - started
                cpu_after = thread_cpu(pids)
                process.send_signal(signal.SIGTERM)
                status = await process.wait()
                if status != 0:
                    raise RuntimeError(f"the worker exited {status}: {stderr.decode()[-2000:]}")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return {"rate": jobs / elapsed, **cores_used(cpu_before, cpu_after, elapsed, jobs)}


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
            runs: list[dict[str, Any]] = []
            for rnd in range(rounds):
                got: dict[str, dict[str, float]] = {}
                order = [("one", one), ("two", two)]
                for label, flags in order if rnd % 2 == 0 else order[::-1]:
                    queue = f"cores.{len(out['cases'])}.r{rnd}.{label}"
                    got[label] = await jobs_per_second(
                        python, server.address, queue, flags, jobs, turns
                    )
                ratio = got["two"]["rate"] / got["one"]["rate"]
                runs.append({**got, "ratio": ratio})
                log(
                    f"{name} round {rnd + 1}/{rounds}: {got['one']['rate']:.1f} ->"
                    f" {got['two']['rate']:.1f} jobs/s, {ratio:.2f}x; cores busy"
                    f" {got['one']['cores']:.2f} -> {got['two']['cores']:.2f} (event loops"
                    f" {got['one']['loop_cores']:.2f} -> {got['two']['loop_cores']:.2f}); CPU"
                    f" per job {got['one']['cpu_ms_per_job']:.1f} ->"
                    f" {got['two']['cpu_ms_per_job']:.1f} ms (event loops"
                    f" {got['one']['loop_ms_per_job']:.1f} -> {got['two']['loop_ms_per_job']:.1f});"
                    f" load {os.getloadavg()[0]:.1f}"
                )
            out["cases"][name] = {"python": python, "runs": runs}
    return out


def render(results: dict[str, Any]) -> str:
    lines = [
        f"### Every core: CPU-bound `def` handlers ({results['jobs']} jobs of"
        f" ~{results['work_ms']:g} ms pure-Python CPU each)",
        "",
        "| case | 1 | 2 | ratio (median, range over rounds) | cores busy, 1 -> 2 (event loops)"
        " | CPU per job, 1 -> 2 (event loops) |",
        "|---|---|---|---|---|---|",
    ]

    def median(runs: list[dict[str, Any]], label: str, key: str) -> float:
        return statistics.median(r[label][key] for r in runs)

    for name, case in results["cases"].items():
        runs = case["runs"]
        ratios = [r["ratio"] for r in runs]
        lines.append(
            f"| {name} | {median(runs, 'one', 'rate'):.1f} jobs/s"
            f" | {median(runs, 'two', 'rate'):.1f} jobs/s"
            f" | {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            f" | {median(runs, 'one', 'cores'):.2f} -> {median(runs, 'two', 'cores'):.2f}"
            f" ({median(runs, 'one', 'loop_cores'):.2f} ->"
            f" {median(runs, 'two', 'loop_cores'):.2f})"
            f" | {median(runs, 'one', 'cpu_ms_per_job'):.1f} ->"
            f" {median(runs, 'two', 'cpu_ms_per_job'):.1f} ms"
            f" ({median(runs, 'one', 'loop_ms_per_job'):.1f} ->"
            f" {median(runs, 'two', 'loop_ms_per_job'):.1f}) |"
        )
    lines += [
        "",
        "processes: `--processes 2` over `--processes 1` (`--max-in-flight 1`); threads: one"
        " process, `--max-in-flight 2` over 1. Cores busy: the CPU of the worker processes'"
        " threads (Linux /proc) over the run's time; in brackets, their main threads', which"
        " run the event loops (reserve, ack, lease extension, logs).",
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
