"""SyncClient shared by threads: CPU per call with 8 threads over CPU per call with 1, per
interpreter (CPython with the GIL, free-threaded CPython 3.13t, ...), on one real server.

Every round starts one driver process per interpreter (benchmarks/blocking_driver.py,
`sepp-trio`: sequential single-job enqueues, 256-byte payload, 200 warm-up calls first) that
runs 1 thread, 8 threads, 8 threads, 1 thread on the same SyncClient (so a load that drifts
on this shared machine weighs on both alike), the interpreter order rotating every round. CPU
is the driver process's `process_time` (all its threads), summed per thread count; the ratio
is taken per round (all in one process, seconds apart) and the table shows the median with
the range over rounds. See benchmarks/README.md, "Threads sharing a SyncClient".

    .venv/bin/python -m benchmarks.threads [--python LABEL=PATH ...] [--rounds 5] [--jobs 2000]
                                [--update-readme]
"""

from __future__ import annotations

import argparse
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
START, END = "<!-- threads-results:start -->", "<!-- threads-results:end -->"
CONFIG = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}
FREE_THREADED_VENV = REPO / ".venv313t"  # a free-threaded CPython's venv, if there is one
# Printed next to the table: which build it is, and whether the GIL is on once sepp is in.
_DESCRIBE = (
    "import sys, sysconfig; sys.path.insert(0, sys.argv[1]); import sepp, sepp.testing;"
    "from google.protobuf.internal import api_implementation as pb;"
    "gil = getattr(sys, '_is_gil_enabled', lambda: True)();"
    "ft = bool(sysconfig.get_config_var('Py_GIL_DISABLED'));"
    "print(f\"{sys.implementation.name} {sys.version.split()[0]}{'t' if ft else ''},"
    " GIL {'on' if gil else 'off'}, protobuf {pb.Type()}\")"
)


def default_pythons() -> dict[str, str]:
    pythons = {f"py{sys.version_info[0]}.{sys.version_info[1]}": sys.executable}
    free_threaded = FREE_THREADED_VENV / "bin" / "python"
    if free_threaded.exists():
        pythons["py3.13t"] = str(free_threaded)
    return pythons


def describe(python: str) -> str:
    out = subprocess.run(
        [python, "-c", _DESCRIBE, str(SRC)],
        check=True,
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    return out.stdout.strip()


async def measure(
    pythons: dict[str, str], rounds: int, jobs: int, threads: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    labels = list(pythons)
    async with sepp.testing.sepp_server(CONFIG) as server:
        for index in range(rounds):
            shift = index % len(labels)
            for label in labels[shift:] + labels[:shift]:
                queue = f"threads-{index}-{label}"
                argv = [pythons[label], str(DRIVER), "sepp-trio", server.address, queue]
                counts = f"1,{threads},{threads},1"
                result = await run_json([*argv, str(jobs), counts], _clean_env(), timeout=600)
                one = _summed([r for r in result["runs"] if r["threads"] == 1])
                many = _summed([r for r in result["runs"] if r["threads"] == threads])
                row = {
                    "round": index,
                    "python": label,
                    "one": one,
                    "many": many,
                    "cpu_ratio": many["cpu_ms_per_call"] / one["cpu_ms_per_call"],
                }
                rows.append(row)
                print(
                    f"round {index} {label}: 1 thread {one['cpu_ms_per_call'] * 1e3:.0f} µs/call,"
                    f" {threads} threads {many['cpu_ms_per_call'] * 1e3:.0f} µs/call,"
                    f" ratio {row['cpu_ratio']:.2f}",
                    file=sys.stderr,
                )
    return rows


def _summed(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Runs of one thread count as one: CPU and context switches per call over all their
    calls, and their calls over their wall time."""
    ops = sum(r["ops"] for r in runs)
    return {
        "ops": ops,
        "ops_s": ops / sum(r["ops"] / r["ops_s"] for r in runs),
        "cpu_ms_per_call": sum(r["cpu_ms_per_call"] * r["ops"] for r in runs) / ops,
        "switches_per_call": sum(r["switches_per_call"] * r["ops"] for r in runs) / ops,
    }


def table(rows: list[dict[str, Any]], pythons: dict[str, str], threads: int) -> str:
    head = (
        f"| interpreter | CPU µs/call, 1 thread | CPU µs/call, {threads} threads |"
        f" {threads} threads / 1 (CPU per call) | ops/s, 1 thread | ops/s, {threads} threads |"
        f" context switches/call, 1 | context switches/call, {threads} |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for label in pythons:
        mine = [r for r in rows if r["python"] == label]

        def median(side: str, key: str, scale: float = 1.0, rs: list[Any] = mine) -> float:
            return statistics.median(r[side][key] * scale for r in rs)

        ratios = [r["cpu_ratio"] for r in mine]
        lines.append(
            f"| {label}: {describe(pythons[label])}"
            f" | {median('one', 'cpu_ms_per_call', 1e3):.0f}"
            f" | {median('many', 'cpu_ms_per_call', 1e3):.0f}"
            f" | **{statistics.median(ratios):.2f}** ({min(ratios):.2f}-{max(ratios):.2f})"
            f" | {median('one', 'ops_s'):,.0f} | {median('many', 'ops_s'):,.0f}"
            f" | {median('one', 'switches_per_call'):.1f}"
            f" | {median('many', 'switches_per_call'):.1f} |"
        )
    return head + "\n".join(lines) + "\n"


def parse_python(text: str) -> tuple[str, str]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=PATH, got {text!r}")
    return label, path


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.threads")
    parser.add_argument(
        "--python",
        type=parse_python,
        action="append",
        metavar="LABEL=PATH",
        help="an interpreter to measure (repeatable; default: this one, and .venv313t's)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2000, help="calls per run (4 a round)")
    parser.add_argument("--threads", type=int, default=8, help="threads sharing the client")
    parser.add_argument("--update-readme", action="store_true")
    opts = parser.parse_args()
    pythons = dict(opts.python) if opts.python else default_pythons()
    rows = trio.run(measure, pythons, opts.rounds, opts.jobs, opts.threads)
    what = f"{opts.rounds} rounds of 4 runs of {opts.jobs} calls per interpreter"
    command = f"python -m benchmarks.threads --rounds {opts.rounds} --jobs {opts.jobs}"
    text = results_header(f"{what}, `persist_mode=buffer`", f"{command} --update-readme")
    text += table(rows, pythons, opts.threads)
    print(text)
    if opts.update_readme:
        replace_marked(README, START, END, text)


if __name__ == "__main__":
    main()
