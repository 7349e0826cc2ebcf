"""Profile the sepp-trio side of one benchmark scenario under cProfile.

    python -m benchmarks.profiling [--scenario enqueue_64] [--size 1.0] [--top 30]
                                 [--persist-mode buffer] [--stats-out PATH] [--py-spy PATH]

Starts a sepp server, runs the scenario once as warm-up and once measured in the same
sepp-trio driver process the harness uses, with cProfile around the measured region only.
Prints the top functions by self time, then self time grouped by component (h2, hpack,
hyperframe, protobuf, trio, sepp, ...) as microseconds per operation. cProfile's own overhead
inflates code that makes many small Python calls (h2, hpack) more than C code; so
``--py-spy PATH`` (the py-spy binary) additionally samples the same run without cProfile and
prints py-spy's self-time breakdown, which is the unbiased one.
"""

from __future__ import annotations

import argparse
import collections
import pstats
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from ._drivers import REPO, DriverProcess, trio_spec
from .runner import RESULTS_DIR, SCENARIOS, preload

if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

import sepp
import sepp.testing

# Longest match first: the component a function's file belongs to.
COMPONENTS = [
    ("/h2/", "h2"),
    ("/hpack/", "hpack"),
    ("/hyperframe/", "hyperframe"),
    ("/google/protobuf/", "protobuf"),
    ("/sepp/_pb/", "protobuf (gencode)"),
    ("/sepp/wire/", "sepp.wire"),
    ("/sepp/", "sepp (API layer)"),
    ("/trio/_core/", "trio core (scheduler, I/O)"),
    ("/trio/", "trio (sockets, sync)"),
    ("/benchmarks/", "bench driver"),
    ("/outcome/", "trio core (scheduler, I/O)"),
    ("/enum.py", "stdlib enum"),
    ("/logging/", "stdlib logging"),
]


def component(filename: str, funcname: str) -> str:
    if filename == "~":  # builtins: attribute them by name
        if "socket" in funcname and ("send" in funcname or "recv" in funcname):
            return "syscalls (socket send/recv)"
        if "epoll" in funcname or "select" in funcname or "poll" in funcname:
            return "syscalls (epoll wait)"
        return "builtins (C functions)"
    for needle, name in COMPONENTS:
        if needle in filename:
            return name
    return "other Python (stdlib)"


def report(stats_path: Path, n_ops: int, top: int) -> dict[str, Any]:
    st = pstats.Stats(str(stats_path))
    raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    rows = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)
    print(
        f"\ncProfile: {total:.3f} s of self time over {n_ops} ops = {total / n_ops * 1e6:.0f} µs/op"
    )
    print(f"{'self µs/op':>10} {'self %':>7} {'calls/op':>9}  function")
    for (filename, line, func), (_cc, nc, tt, _ct, _callers) in rows[:top]:
        short = filename.replace(str(REPO) + "/", "")
        short = short.split("site-packages/")[-1]
        print(
            f"{tt / n_ops * 1e6:10.1f} {tt / total * 100:6.1f}% {nc / n_ops:9.1f}  "
            f"{func} ({short}:{line})"
        )
    groups: dict[str, float] = collections.defaultdict(float)
    for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in raw.items():
        groups[component(filename, func)] += tt
    print(f"\n{'µs/op':>8} {'share':>6}  component (cProfile self time)")
    for name, tt in sorted(groups.items(), key=lambda kv: kv[1], reverse=True):
        print(f"{tt / n_ops * 1e6:8.1f} {tt / total * 100:5.1f}%  {name}")
    return {"total_s": total, "groups": dict(groups)}


async def amain(a: argparse.Namespace) -> None:
    scenario = SCENARIOS[a.scenario]
    config = {"admin": {"enabled": False}, "storage": {"persist_mode": a.persist_mode}}
    stats_path = Path(a.stats_out) if a.stats_out else Path(tempfile.mkdtemp()) / "bench.pstats"
    async with sepp.testing.sepp_server(config) as server:
        driver = DriverProcess(
            trio_spec(sys.executable, otel=a.otel), RESULTS_DIR / "logs" / "profile.log"
        )
        await driver.start()
        try:
            await driver.request("connect", addr=server.address)
            async with sepp.open(server.address) as loader:
                batch_max = (await loader.get_server_info()).max_enqueue_batch
                runs: list[tuple[str, float, str | None]] = [
                    ("warm", 0.1, None),
                    ("plain", a.size, None),
                ]
                runs.append(("profiled", a.size, str(stats_path)))
                if a.py_spy:
                    runs.append(("py-spy", a.size, "py-spy"))
                for label, factor, prof in runs:
                    args, n_preload = scenario.build(factor)
                    queue = f"prof.{scenario.name}.{label}"
                    if n_preload:
                        await preload(loader, queue, n_preload, batch_max)
                    extra: dict[str, Any] = {}
                    spy: trio.Process | None = None
                    if prof == "py-spy":
                        pid = (await driver.request("ping"))["pid"]
                        spy = await trio.lowlevel.open_process(
                            [
                                a.py_spy,
                                "record",
                                "--pid",
                                str(pid),
                                "--format",
                                "raw",
                                "--rate",
                                "500",
                                "--output",
                                str(stats_path.with_suffix(".pyspy.txt")),
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                        await trio.sleep(1.0)
                    elif prof:
                        extra["profile_out"] = prof
                    result = await driver.request(scenario.op, queue=queue, **args, **extra)
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        with trio.fail_after(30):
                            await spy.wait()
                    if scenario.kind == "throughput":
                        print(
                            f"{label:>8}: {result['n'] / result['elapsed_s']:,.0f} ops/s, "
                            f"CPU {result['cpu_s'] / result['n'] * 1e6:.0f} µs/op "
                            f"({result['n']} ops)"
                        )
                    else:
                        print(f"{label:>8}: {result}")
                    if label == "profiled":
                        report(stats_path, int(result.get("n", 1)), a.top)
                    if spy is not None:
                        report_pyspy(stats_path.with_suffix(".pyspy.txt"), a.top)
        finally:
            await driver.aclose()
    print(f"\ncProfile stats: {stats_path}")


def report_pyspy(raw_path: Path, top: int) -> None:
    """py-spy's raw format: one collapsed stack per line with a sample count."""
    if not raw_path.exists():
        print("py-spy wrote nothing (permissions? see its stderr)")
        return
    self_counts: dict[str, int] = collections.defaultdict(int)
    groups: dict[str, int] = collections.defaultdict(int)
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        # py-spy leaves out idle samples (epoll waits), and the driver does nothing but the
        # measured op while sampled: every sample counts, the connection's reader and writer
        # tasks included (their stacks do not pass through the bench op).
        func, _, where = frames[-1].partition(" (")
        path = where.rsplit(":", 1)[0]  # drop the line number: aggregate per function
        total += count
        self_counts[f"{func} ({path})"] += count
        groups[component("/" + path, func)] += count
    if not total:
        print("py-spy: no samples")
        return
    print(f"\npy-spy: {total} samples while the op ran; top functions by self time")
    for leaf, count in sorted(self_counts.items(), key=lambda kv: kv[1], reverse=True)[:top]:
        short = leaf.split("site-packages/")[-1].replace(str(REPO) + "/", "")
        print(f"{count / total * 100:6.1f}%  {short}")
    print(f"\n{'share':>6}  component (py-spy self time)")
    for name, count in sorted(groups.items(), key=lambda kv: kv[1], reverse=True):
        print(f"{count / total * 100:5.1f}%  {name}")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profiling", description=__doc__)
    p.add_argument("--scenario", default="enqueue_64", choices=sorted(SCENARIOS))
    p.add_argument("--size", type=float, default=1.0, help="size factor, as in the harness")
    p.add_argument("--persist-mode", default="buffer", choices=["buffer", "sync_data"])
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--otel", action="store_true", help="let sepp-trio import opentelemetry")
    p.add_argument("--stats-out", default=None, help="where to keep the cProfile stats")
    p.add_argument("--py-spy", default=None, metavar="PATH", help="py-spy binary: also sample")
    trio.run(amain, p.parse_args())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
