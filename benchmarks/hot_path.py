"""The Worker's per-job cost against the raw drain's, counted rather than timed.

    python -m benchmarks.hot_path [--jobs 500 2500] [--cases raw worker ...] [--repeat 1]
                                  [--cprofile] [--no-callgrind] [--top 40] [--src DIR]

Each case is `bench_drain_raw` or `bench_drain_worker` (64 in flight, `auto_extend` off: the
`drain_raw` and `drain_worker_noext` scenarios) in `benchmarks/trio_driver.py` under
`valgrind --tool=callgrind`, against one real server (`persist_mode=buffer`). A case runs
twice, with each of two job counts, in a fresh driver process (import, connect, a 200-job
warm-up drain, the measured drain); the difference of the two runs' instruction counts over
the difference of their job counts is the case's instructions per job, free of everything
a run does once. Instructions are what the load of a shared machine does not move; wall time
under callgrind is meaningless and not shown.

Cases: `raw`, `worker`, and `worker+PATCHES`: the Worker with `benchmarks/experiments.py`
patches applied (comma-separated), for the ablations that size each part of the Worker's
per-job work (`w_no_log`, `log_info`, ...); `asyncio-raw` and `asyncio-worker` the same on
the asyncio front end (`benchmarks/asyncio_driver.py`, asyncio's own loop). `--src DIR`
measures another checkout's `src/` (main's, say, for a before and after in one run).

`--cprofile` also runs each case once, plainly, with cProfile around the measured drain, and
prints the calls per job of every function the case calls at least once a job: the counts
are exact, the times cProfile's (inflated for small Python calls).
"""

from __future__ import annotations

import argparse
import os
import pstats
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from ._drivers import BENCH_DIR, REPO, SRC, TRIO_DRIVER, ClientSpec, DriverProcess, _clean_env
from .runner import LEASE_S, preload

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import sepp
import sepp.testing

ASYNCIO_DRIVER = BENCH_DIR / "asyncio_driver.py"
WARMUP = 200
IN_FLIGHT = 64
LOGS = REPO / "benchmarks" / "results" / "logs"


def _driver_argv(case: str, experiment: str, callgrind_out: Path | None, src: Path) -> list[str]:
    driver = ASYNCIO_DRIVER if case.startswith("asyncio-") else TRIO_DRIVER
    argv = [sys.executable, str(driver), "--no-otel", "--src", str(src)]
    if experiment:
        argv += ["--experiment", experiment]
    if callgrind_out is None:
        return argv
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    return [valgrind, "--tool=callgrind", f"--callgrind-out-file={callgrind_out}", *argv]


def _op(case: str) -> tuple[str, dict[str, Any]]:
    if case.removeprefix("asyncio-") == "raw":
        return "bench_drain_raw", {"in_flight": IN_FLIGHT, "lease_s": LEASE_S, "wait_s": 1}
    return "bench_drain_worker", {
        "max_in_flight": IN_FLIGHT,
        "lease_s": LEASE_S,
        "wait_s": 5,
        "auto_extend": False,
    }


def _instructions(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"(?:summary|totals):\s+(\d+)", line)
        if m:
            return int(m.group(1))
    raise RuntimeError(f"no instruction total in {path}")


async def _run_case(
    loader: sepp.Client,
    address: str,
    case: str,
    n: int,
    *,
    callgrind_out: Path | None = None,
    profile_out: Path | None = None,
    batch: int,
    src: Path,
) -> dict[str, Any]:
    experiment = case.partition("+")[2]
    op, args = _op(case.partition("+")[0])
    argv = _driver_argv(case, experiment, callgrind_out, src)
    spec = ClientSpec(case, argv, None, _clean_env())
    tag = f"{os.getpid()}.{case}.{n}.{trio.current_time():.0f}".replace(",", "_")
    driver = DriverProcess(spec, LOGS / "hot_path.log")
    await driver.start()
    try:
        await driver.request("connect", addr=address)
        for label, count, extra in (
            ("warm", WARMUP, {}),
            ("measured", n, {"profile_out": str(profile_out)} if profile_out else {}),
        ):
            queue = f"hot.{tag}.{label}"
            await preload(loader, queue, count, batch)
            result = await driver.request(op, queue=queue, n=count, timeout=3600, **args, **extra)
            if result["n"] != count:
                raise RuntimeError(f"{case}: drained {result['n']} of {count}")
        await driver.request("shutdown")
    finally:
        await driver.aclose()
    return result


def _cprofile_rows(path: Path, n: int, top: int) -> None:
    st = pstats.Stats(str(path))
    raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    rows = [(k, v) for k, v in raw.items() if v[1] >= n * 0.9]
    rows.sort(key=lambda kv: kv[1][2], reverse=True)
    total_calls = sum(v[1] for v in raw.values())
    total = sum(v[2] for v in raw.values())
    print(
        f"  {total_calls / n:.1f} calls per job in all, cProfile self time {total / n * 1e6:.0f}"
        f" µs per job; functions called at least 0.9 times a job, by self time:"
    )
    for (filename, line, func), (_cc, nc, tt, _ct, _callers) in rows[:top]:
        short = filename.replace(str(REPO) + "/", "").split("site-packages/")[-1]
        print(f"  {nc / n:6.2f} calls {tt / n * 1e6:6.1f} µs  {func} ({short}:{line})")


async def amain(a: argparse.Namespace) -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    config = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}
    tmp = Path(tempfile.mkdtemp(prefix="sepp-hot-path-"))
    small, big = a.jobs
    async with sepp.testing.sepp_server(config) as server:
        async with sepp.open(server.address) as loader:
            batch = (await loader.get_server_info()).max_enqueue_batch
            per_job: dict[str, list[float]] = {case: [] for case in a.cases}
            for r in range(a.repeat):
                for case in a.cases:
                    if a.callgrind:
                        counts = []
                        for n in (small, big):
                            out = tmp / f"cg.{case}.{n}.{r}"
                            await _run_case(
                                loader,
                                server.address,
                                case,
                                n,
                                callgrind_out=out,
                                batch=batch,
                                src=a.src,
                            )
                            counts.append(_instructions(out))
                        ir = (counts[1] - counts[0]) / (big - small)
                        per_job[case].append(ir)
                        print(f"{case:>40}: {ir:,.0f} instructions per job", flush=True)
                    if a.cprofile and r == 0:
                        prof = tmp / f"prof.{case}"
                        result = await _run_case(
                            loader,
                            server.address,
                            case,
                            big,
                            profile_out=prof,
                            batch=batch,
                            src=a.src,
                        )
                        cpu = result["cpu_s"] / big * 1e6
                        print(f"{case}: cProfile, {big} jobs, CPU {cpu:.0f} µs per job (profiled)")
                        _cprofile_rows(prof, big, a.top)
    if a.callgrind:
        print("\ninstructions per job (median of the repeats), and over the raw drain:")
        medians = {case: sorted(v)[len(v) // 2] for case, v in per_job.items()}
        for case, med in medians.items():
            base = medians.get("asyncio-raw" if case.startswith("asyncio-") else "raw")
            ratio = f"  {med / base:.3f}x its raw drain" if base else ""
            print(f"{case:>40}: {med:,.0f}{ratio}")
    print(f"\nfiles: {tmp}")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hot_path", description=__doc__)
    p.add_argument("--jobs", type=int, nargs=2, default=[500, 2500], metavar=("SMALL", "BIG"))
    p.add_argument("--cases", nargs="+", default=["raw", "worker"])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--no-callgrind", dest="callgrind", action="store_false")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--src", type=Path, default=SRC, help="the src/ to measure (this checkout's)")
    a = p.parse_args()
    trio.run(amain, a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
