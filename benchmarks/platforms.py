"""The platform section of `make bench`: CPU per enqueue (64 tasks, 256-byte payloads, one
real server, `persist_mode=buffer`) of sepp-trio's message codecs where protobuf's C
implementation (upb) is there and where it is not, in one run, as ratios per round.

    python -m benchmarks.platforms [--rounds 5] [--jobs 2000] [--big-jobs 60]

Drivers (benchmarks/trio_driver.py, one process each, connected and warmed up once):

- `upb+protobuf`: CPython with upb, the generated classes as the codec (SEPP_MESSAGE_CODEC=
  protobuf): the figure the issue-27 targets are ratios of;
- `upb+sepp`: CPython with upb, our codec (the default);
- `pure+sepp`: CPython with protobuf's pure-Python implementation installed
  (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python), our codec: what PyPy and free-threaded
  builds run, without their interpreter's own costs;
- `pure+protobuf`: the same with the generated classes (what those platforms paid before);
- `pypy3.11` and `py3.13t` (our codec), when scripts/ensure-interpreters.sh has them cached
  with a test-matrix virtualenv (this never builds them): PyPy's figure after 30,000 calls
  (warm, the JIT's) and for its first 300 (cold, a new process);
- `py3.13-riscv64`, `py3.13-s390x` and `py3.13-ppc64le` (our codec) likewise: under
  qemu-user on this machine, so their figures are the emulation's cost, never those
  machines' own speed.

Also the 1 MiB-payload enqueue (64 tasks): ms of client CPU per enqueue on each codec (upb).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from ._drivers import REPO, SRC, TRIO_DRIVER, ClientSpec, DriverProcess, _clean_env

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import sepp
import sepp.testing

CACHE = Path(os.environ.get("SEPP_TRIO_CACHE", Path.home() / ".cache" / "sepp-trio"))
# Interpreter -> (its home in the cache, the matrix part's virtualenv python, under
# matrix/<hash of the requirements>/: the newest one is taken).
INTERPRETERS = {
    "pypy3.11": ("interpreters/pypy3.11-trixie", "pypy3.11/bin/python"),
    "py3.13t": ("interpreters/python3.13t-debian", "py3.13t/bin/python"),
    **{
        f"py3.13-{machine}": (
            f"interpreters/python3.13-trixie-{debian}",
            f"py3.13-{machine}/bin/python",
        )
        for machine, debian in (("riscv64", "riscv64"), ("s390x", "s390x"), ("ppc64le", "ppc64el"))
    },
}
EMULATED = ("py3.13-riscv64", "py3.13-s390x", "py3.13-ppc64le")
PAYLOAD = 256
WARM_CALLS = 30_000
COLD_CALLS = 300


def spec(name: str, python: str, **env: str) -> ClientSpec:
    return ClientSpec(
        name, [python, str(TRIO_DRIVER), "--no-otel", "--src", str(SRC)], None, _clean_env(env)
    )


def cached_interpreters() -> dict[str, str]:
    """The interpreters cached with a virtualenv that has sepp's dependencies."""
    found = {}
    for name, (home, venv) in INTERPRETERS.items():
        pythons = sorted((CACHE / "matrix").glob(f"*/{venv}"), key=lambda p: p.stat().st_mtime)
        if (CACHE / home / ".complete").exists() and pythons:
            found[name] = str(pythons[-1])
    return found


async def _cpu_per_op(driver: DriverProcess, queue: str, n: int, payload: int = PAYLOAD) -> float:
    result = await driver.request(
        "bench_enqueue", queue=queue, n=n, concurrency=64, payload_size=payload
    )
    return float(result["cpu_s"]) / int(result["n"])


async def _drain(client: sepp.Client, queue: str, n: int) -> None:
    left = n
    while left > 0:
        jobs = await client.reserve(queue, lease_duration=60, wait_timeout=1, max_jobs=64)
        if not jobs:
            return
        left -= len(jobs)
        async with trio.open_nursery() as nursery:
            for job in jobs:
                nursery.start_soon(client.ack, job.ctx)


async def measure(rounds: int, jobs: int, big_jobs: int, log_dir: Path) -> dict[str, Any]:
    python = sys.executable
    specs = [
        spec("upb+protobuf", python, SEPP_MESSAGE_CODEC="protobuf"),
        spec("upb+sepp", python, SEPP_MESSAGE_CODEC="sepp"),
        spec("pure+sepp", python, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python"),
        spec(
            "pure+protobuf",
            python,
            PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python",
            SEPP_MESSAGE_CODEC="protobuf",
        ),
    ]
    others = cached_interpreters()
    specs += [spec(name, path) for name, path in others.items()]
    cpu: dict[str, list[float]] = {s.name: [] for s in specs}
    big: dict[str, list[float]] = {"upb+protobuf": [], "upb+sepp": []}
    cold: list[float] = []
    config = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}
    async with sepp.testing.sepp_server(config) as server:
        drivers = [DriverProcess(s, log_dir / f"platform-{s.name}.log") for s in specs]
        async with sepp.open(server.address) as loader:
            try:
                for driver in drivers:
                    await driver.start()
                    await driver.request("connect", addr=server.address, timeout=60)
                    warm = WARM_CALLS if driver.name == "pypy3.11" else COLD_CALLS
                    await _cpu_per_op(driver, f"platform.warm.{driver.name}", warm)
                    await _drain(loader, f"platform.warm.{driver.name}", warm)
                for round_no in range(rounds):
                    order = drivers[round_no % len(drivers) :] + drivers[: round_no % len(drivers)]
                    for driver in order:
                        queue = f"platform.{round_no}.{driver.name}"
                        cpu[driver.name].append(await _cpu_per_op(driver, queue, jobs))
                        if driver.name in big:
                            queue += ".1m"
                            per_op = await _cpu_per_op(driver, queue, big_jobs, 1024 * 1024)
                            big[driver.name].append(per_op)
                            await _drain(loader, queue, big_jobs)
                    log(f"platform round {round_no + 1}/{rounds}: " + ", ".join(
                        f"{name} {values[-1] * 1e6:.0f} µs" for name, values in cpu.items()
                    ))  # fmt: skip
            finally:
                for driver in drivers:
                    await driver.aclose()
        if "pypy3.11" in others:  # cold: the first COLD_CALLS of a new process, per round
            for round_no in range(rounds):
                driver = DriverProcess(spec("pypy3.11", others["pypy3.11"]), log_dir / "cold.log")
                try:
                    await driver.start()
                    await driver.request("connect", addr=server.address, timeout=60)
                    cold.append(await _cpu_per_op(driver, f"platform.cold.{round_no}", COLD_CALLS))
                finally:
                    await driver.aclose()
    return {
        "rounds": rounds,
        "jobs": jobs,
        "big_jobs": big_jobs,
        "cpu_per_op_s": cpu,
        "big_cpu_per_op_s": big,
        "pypy_cold_cpu_per_op_s": cold,
        "interpreters": others,
        "missing": [name for name in INTERPRETERS if name not in others],
    }


def _ratios(a: Sequence[float], b: Sequence[float]) -> str:
    values = [x / y for x, y in zip(a, b, strict=True) if y]
    if not values:
        return "n/a"
    return f"**{statistics.median(values):.2f}** ({min(values):.2f}-{max(values):.2f})"


def _us(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1e6:.0f}" if values else "n/a"


def render(results: dict[str, Any]) -> str:
    cpu = results["cpu_per_op_s"]
    base = cpu["upb+protobuf"]
    lines = [
        f"### Platforms: CPU per enqueue (64 tasks, {results['rounds']} rounds of"
        f" {results['jobs']:,} enqueues per driver, `persist_mode=buffer`)",
        "",
        "| driver | CPU µs/enqueue (median) | over `upb+protobuf` (per round) | target |",
        "|---|---|---|---|",
    ]
    targets = {
        "upb+sepp": "≤ 1.0 (else protobuf stays the default under upb)",
        "pure+sepp": "≤ 1.1",
        "py3.13t": "≤ 1.6",
    }
    for name, values in cpu.items():
        ratio = "1" if name == "upb+protobuf" else _ratios(values, base)
        lines.append(f"| `{name}` | {_us(values)} | {ratio} | {targets.get(name, '')} |")
    lines.append("")
    lines.append(
        f"- `pure+sepp` over `pure+protobuf` (our codec where upb is missing, over the"
        f" generated classes there): {_ratios(cpu['pure+sepp'], cpu['pure+protobuf'])}"
    )
    if emulated := [name for name in EMULATED if name in cpu]:
        lines.append(
            f"- {', '.join(f'`{name}`' for name in emulated)}: under qemu-user on this machine,"
            " the emulation's cost per call, not those processors' speed"
        )
    if "pypy3.11" in cpu:
        lines.append(
            f"- PyPy 3.11, our codec: warm (after {WARM_CALLS:,} calls) {_us(cpu['pypy3.11'])}"
            f" µs, cold (the first {COLD_CALLS} of a new process)"
            f" {_us(results['pypy_cold_cpu_per_op_s'])} µs per enqueue"
        )
    for name in results["missing"]:
        lines.append(
            f"- `{name}`: not measured (not cached with its test-matrix virtualenv: `make"
            " matrix` or scripts/ensure-interpreters.sh and scripts/test_matrix.py make it)"
        )
    big = results["big_cpu_per_op_s"]
    lines.append(
        f"- 1 MiB payloads, 64 tasks ({results['big_jobs']} per round): client CPU per enqueue"
        f" {statistics.median(big['upb+sepp']) * 1e3:.3f} ms with our codec,"
        f" {statistics.median(big['upb+protobuf']) * 1e3:.3f} ms with the generated classes"
        f" (ours over theirs {_ratios(big['upb+sepp'], big['upb+protobuf'])}; target ≤ 0.4 ms)"
    )
    return "\n".join(lines)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.platforms", description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=2000, help="enqueues per driver and round")
    p.add_argument("--big-jobs", type=int, default=60, help="1 MiB enqueues per round")
    return p.parse_args(argv)


async def amain(rounds: int, jobs: int, big_jobs: int) -> dict[str, Any]:
    log_dir = REPO / "benchmarks" / "results" / "logs"
    return await measure(rounds, jobs, big_jobs, log_dir)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = trio.run(amain, args.rounds, args.jobs, args.big_jobs)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
