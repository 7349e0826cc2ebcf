"""The side-by-side benchmark: sepp-trio against sepp-py (and optionally sepp-rs).

One real sepp server per persist mode (started here through ``sepp.testing``, same config for
every client), one driver process per client, and for every round and scenario the clients run
one after the other, in an order that flips every round, each on a fresh queue. Per scenario we
report the median over rounds of each client's throughput and client CPU per 1,000 operations
(from the client process's own ``time.process_time()``), and the median of the per-round ratios
with their range (min-max over rounds).
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from ._drivers import (
    BENCH_DIR,
    OTEL_API,
    PURE_PROTOBUF,
    REPO,
    RS_CRATE,
    SEPP_PY,
    SEPP_RS,
    SEPP_TRIO,
    SRC,
    ClientSpec,
    DriverFailed,
    DriverProcess,
    probe_args,
    rs_spec,
    run_json,
    seppy_spec,
    trio_spec,
)

# The checkout is what we measure: its src/ wins over any installed sepp-trio.
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import sepp
import sepp.testing

RESULTS_DIR = BENCH_DIR / "results"
README = BENCH_DIR / "README.md"
README_START = "<!-- bench-results:start -->"
README_END = "<!-- bench-results:end -->"
PERSIST_MODES = ("buffer", "sync_data")
PAYLOAD_SIZE = 256
LEASE_S = 60.0


# -- scenarios -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    op: str
    kind: str  # "throughput" or "latency"
    # Given a size factor, the op's arguments (minus the queue) and how many jobs to preload.
    build: Callable[[float], tuple[dict[str, Any], int]]
    # A new driver process per measurement, warmed up with FRESH_WARMUP calls first (the
    # short-lived producer: no long-lived process whose caches are hot).
    fresh: bool = False
    # The harness drains the queue after the run (untimed): big payloads would otherwise pile
    # up gigabytes in the server over the rounds.
    drain_after: bool = False
    # The clients it runs on, when not every one has the feature (the others show n/a).
    only: frozenset[str] = frozenset()


def _n(base: int, factor: float, floor: int = 50) -> int:
    return max(floor, int(base * factor))


def _enqueue(concurrency: int, base: int) -> Callable[[float], tuple[dict[str, Any], int]]:
    def build(f: float) -> tuple[dict[str, Any], int]:
        return {
            "n": _n(base, f),
            "concurrency": concurrency,
            "payload_size": PAYLOAD_SIZE,
        }, 0

    return build


def _big_enqueue(size: int, base: int) -> Callable[[float], tuple[dict[str, Any], int]]:
    def build(f: float) -> tuple[dict[str, Any], int]:
        return {"n": _n(base, f, 20), "concurrency": 64, "payload_size": size}, 0

    return build


def _batch(f: float) -> tuple[dict[str, Any], int]:
    return {
        "n_batches": _n(120, f, 10),
        "batch_size": 100,
        "concurrency": 1,
        "payload_size": PAYLOAD_SIZE,
    }, 0


def _outbox(f: float) -> tuple[dict[str, Any], int]:
    return {"n": _n(3000, f), "batch_size": 100, "payload_size": PAYLOAD_SIZE}, 0


def _auto_batched(f: float) -> tuple[dict[str, Any], int]:
    args, n = _enqueue(64, 6000)(f)
    return {**args, "auto_batch": True}, n


def _drain_raw(f: float) -> tuple[dict[str, Any], int]:
    n = _n(6000, f)
    return {"n": n, "in_flight": 64, "lease_s": LEASE_S, "wait_s": 1}, n


def _drain_worker(auto_extend: bool | None) -> Callable[[float], tuple[dict[str, Any], int]]:
    def build(f: float) -> tuple[dict[str, Any], int]:
        n = _n(6000, f)
        args: dict[str, Any] = {"n": n, "max_in_flight": 64, "lease_s": LEASE_S, "wait_s": 5}
        if auto_extend is not None:
            args["auto_extend"] = auto_extend
        return args, n

    return build


FRESH_WARMUP = 300


def _fresh_enqueue(f: float) -> tuple[dict[str, Any], int]:
    # Fixed size whatever --size/--quick say: the scenario is defined by its numbers.
    return {"n": 6000, "concurrency": 64, "payload_size": PAYLOAD_SIZE}, 0


def _latency(f: float) -> tuple[dict[str, Any], int]:
    return {"n": _n(300, f), "warmup": 20, "payload_size": 16, "max_in_flight": 16}, 0


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("enqueue_1", "enqueue, 1 task", "bench_enqueue", "throughput", _enqueue(1, 2000)),
        Scenario(
            "enqueue_64", "enqueue, 64 tasks", "bench_enqueue", "throughput", _enqueue(64, 6000)
        ),
        Scenario(
            "enqueue_64_batched",
            "enqueue, 64 tasks, sepp-trio auto-batching on",
            "bench_enqueue",
            "throughput",
            _auto_batched,
        ),
        Scenario(
            "enqueue_64_fresh",
            f"enqueue, 64 tasks, a new process each time ({FRESH_WARMUP}-call warm-up)",
            "bench_enqueue",
            "throughput",
            _fresh_enqueue,
            fresh=True,
        ),
        Scenario(
            "enqueue_64k",
            "enqueue 64 KiB payloads, 64 tasks",
            "bench_enqueue",
            "throughput",
            _big_enqueue(64 * 1024, 3000),
            drain_after=True,
        ),
        Scenario(
            "enqueue_1m",
            "enqueue 1 MiB payloads, 64 tasks",
            "bench_enqueue",
            "throughput",
            _big_enqueue(1024 * 1024, 300),
            drain_after=True,
        ),
        Scenario(
            "enqueue_batch",
            "enqueue_batch of 100 (jobs/s)",
            "bench_enqueue_batch",
            "throughput",
            _batch,
        ),
        Scenario(
            "outbox_relay",
            "outbox relay, sqlite3, batches of 100 (jobs/s; sepp-py has no outbox)",
            "bench_outbox_relay",
            "throughput",
            _outbox,
            drain_after=True,
            only=frozenset({SEPP_TRIO}),
        ),
        Scenario(
            "drain_raw",
            "drain: reserve + ack, 64 in flight",
            "bench_drain_raw",
            "throughput",
            _drain_raw,
        ),
        Scenario(
            "drain_worker",
            "drain: Worker, max_in_flight 64 (defaults)",
            "bench_drain_worker",
            "throughput",
            _drain_worker(None),
        ),
        Scenario(
            "drain_worker_noext",
            "drain: Worker, 64, auto_extend off (both)",
            "bench_drain_worker",
            "throughput",
            _drain_worker(False),
        ),
        Scenario(
            "latency",
            "latency enqueue -> handler start",
            "bench_latency",
            "latency",
            _latency,
        ),
    )
}
STATIC_SCENARIOS = ("import", "rss")
# Sections of their own, run after the scenarios above (and selectable the same way).
# benchmarks/cores.py: --processes 2 and 3.13t threads on CPU-bound jobs; benchmarks/
# memory_server.py: a user's test on the memory server and on the real one.
SECTIONS = ("cores", "memory")
ALL_SCENARIOS = (*SCENARIOS, *STATIC_SCENARIOS, *SECTIONS)
# Ops sepp-rs's driver does not implement (it has no knob for them).
RS_UNSUPPORTED: frozenset[str] = frozenset()


# -- options ---------------------------------------------------------------------------------


@dataclass
class Options:
    rounds: int
    modes: list[str]
    quick: bool
    scenarios: list[str]
    clients: list[str]
    otel: bool
    out: Path
    update_readme: bool
    import_runs: int
    seppy_python: str | None
    size_factor: float
    command: str
    platform: bool = True


def parse_args(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Side-by-side benchmark of sepp-trio and sepp-py against a real sepp server.",
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds per scenario (5; quick: 3)")
    p.add_argument(
        "--persist-mode",
        choices=["buffer", "sync_data", "both"],
        default="both",
        help="server storage.persist_mode (default: both, buffer first)",
    )
    p.add_argument("--quick", action="store_true", help="smaller runs (about 3 minutes)")
    p.add_argument(
        "--scenarios",
        nargs="+",
        default=None,
        metavar="NAME",
        help=f"subset to run (comma or space separated): {', '.join(ALL_SCENARIOS)}",
    )
    p.add_argument(
        "--rs",
        action="store_true",
        help="also run sepp-rs (builds benchmarks/sepp-rs-bench with cargo on first use)",
    )
    p.add_argument(
        "--no-seppy",
        action="store_true",
        help="leave sepp-py out (with --variant: A/B runs of sepp-trio patches)",
    )
    p.add_argument(
        "--no-h2",
        action="store_true",
        help="leave out the reference wire engine (by default also run as client sepp-trio+h2)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="PATCHES",
        help="also run sepp-trio with benchmarks/experiments.py patches (comma-separated), "
        "reported as client sepp-trio+PATCHES; repeatable",
    )
    p.add_argument(
        "--pure-protobuf",
        action="store_true",
        help="also run sepp-trio on protobuf's pure-Python implementation (client"
        " sepp-trio+pure-protobuf): the cost where protobuf has no wheel",
    )
    p.add_argument(
        "--otel",
        action="store_true",
        help="let both clients import opentelemetry (API + SDK installed, no provider set); "
        "default: blocked in both, the no-extra install",
    )
    p.add_argument(
        "--otel-api",
        action="store_true",
        help="also run each Python client with opentelemetry importable and no provider set "
        "(clients sepp-trio+otel-api, sepp-py+otel-api), reported as CPU ratios to the same "
        "client without it",
    )
    p.add_argument(
        "--size", type=float, default=None, help="scale every scenario's size (1.0; quick: 0.35)"
    )
    p.add_argument("--import-runs", type=int, default=None, help="fresh interpreters per client")
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / "latest.json",
        help="machine-readable results (default: benchmarks/results/latest.json)",
    )
    p.add_argument(
        "--update-readme",
        action="store_true",
        help="replace the results table in benchmarks/README.md with this run's",
    )
    p.add_argument("--seppy-python", default=None, help="sepp-py venv python (default: ensured)")
    p.add_argument(
        "--no-platform",
        action="store_true",
        help="leave out the platform section (benchmarks/platforms.py: each message codec"
        " with and without upb, PyPy and 3.13t when cached)",
    )
    a = p.parse_args(argv)
    names: list[str] = []
    for item in a.scenarios or list(ALL_SCENARIOS):
        names += [x for x in item.split(",") if x]
    unknown = [x for x in names if x not in ALL_SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; choose from {', '.join(ALL_SCENARIOS)}")
    rounds = a.rounds if a.rounds is not None else (3 if a.quick else 5)
    if rounds < 1:
        p.error("--rounds must be at least 1")
    clients = [SEPP_TRIO] + ([] if a.no_seppy else [SEPP_PY]) + ([SEPP_RS] if a.rs else [])
    variants = ([] if a.no_h2 or "h2" in a.variant else ["h2"]) + a.variant
    variants += [PURE_PROTOBUF] if a.pure_protobuf else []
    clients += [f"{SEPP_TRIO}+{v}" for v in variants]
    if a.otel_api:
        clients.append(f"{SEPP_TRIO}+{OTEL_API}")
        if not a.no_seppy:
            clients.append(f"{SEPP_PY}+{OTEL_API}")
    return Options(
        rounds=rounds,
        modes=list(PERSIST_MODES) if a.persist_mode == "both" else [a.persist_mode],
        quick=a.quick,
        scenarios=names,
        clients=clients,
        otel=a.otel,
        out=a.out,
        update_readme=a.update_readme,
        import_runs=a.import_runs or (5 if a.quick else 9),
        seppy_python=a.seppy_python,
        size_factor=a.size if a.size is not None else (0.35 if a.quick else 1.0),
        command=" ".join(["python -m benchmarks", *map(shlex.quote, argv)]),
        platform=not a.no_platform,
    )


# -- environment -----------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ensure_seppy_python(opts: Options) -> str:
    if opts.seppy_python:
        return opts.seppy_python
    log("ensuring the sepp-py virtualenv (scripts/ensure-seppy-venv.sh)")
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "ensure-seppy-venv.sh")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return out.strip().splitlines()[-1]


def ensure_rs_binary() -> str:
    target = Path(
        os.environ.get(
            "SEPP_RS_BENCH_TARGET",
            Path(os.environ.get("SEPP_TRIO_CACHE", Path.home() / ".cache" / "sepp-trio"))
            / "sepp-rs-bench-target",
        )
    )
    binary = target / "release" / "sepp-rs-bench"
    log("building benchmarks/sepp-rs-bench (cargo build --release; slow the first time)")
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", str(RS_CRATE / "Cargo.toml")],
        check=True,
        env={**os.environ, "CARGO_TARGET_DIR": str(target)},
    )
    return str(binary)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cmd_output(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()
    except OSError as exc:
        return f"unavailable ({exc})"


def cpu_pressure() -> float | None:
    """Share of the last 10 s in which some runnable task waited for a CPU (Linux PSI)."""
    try:
        with open("/proc/pressure/cpu", encoding="ascii") as f:
            for line in f:
                if line.startswith("some"):
                    return float(line.split()[1].split("=")[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def contention_sample() -> dict[str, float | None]:
    """How busy the (shared) machine is right now: load average and CPU pressure."""
    return {"loadavg_1m": os.getloadavg()[0], "cpu_pressure_some_avg10": cpu_pressure()}


def machine_info() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "loadavg_start": list(os.getloadavg()),
        "cpu_pressure_start": cpu_pressure(),
    }


# -- statistics ------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float | None:
    clean = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(clean) if clean else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def summarise_throughput(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    per_client: dict[str, Any] = {}
    for client, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        thr = [r["n"] / r["elapsed_s"] for r in ok if r["elapsed_s"] > 0]
        cpu = [r["cpu_s"] / r["n"] * 1000.0 for r in ok if r["n"]]
        per_client[client] = {
            "ops_per_s": _median(thr),
            "cpu_s_per_1k": _median(cpu),
            "ops_per_s_all": thr,
            "cpu_s_per_1k_all": cpu,
            "errors": len(rs) - len(ok),
        }
    summary: dict[str, Any] = {"clients": per_client, "ratios": {}, "otel_api_cost": {}}
    clients = list(runs)
    for base in (c for c in (SEPP_TRIO, SEPP_PY) if f"{c}+{OTEL_API}" in runs and c in runs):
        # CPU per op with opentelemetry importable (no provider) over without, per round.
        per_round = [
            (b["cpu_s"] / b["n"]) / (a["cpu_s"] / a["n"])
            for a, b in zip(runs[base], runs[f"{base}+{OTEL_API}"], strict=False)
            if "error" not in a and "error" not in b and a["n"] and b["n"]
        ]
        summary["otel_api_cost"][base] = {
            "cpu_per_op": _median(per_round),
            "cpu_per_op_per_round": per_round,
        }
    for other in (c for c in clients if c != SEPP_TRIO):
        if SEPP_TRIO not in runs:
            break
        paired_thr, paired_cpu = [], []
        for a, b in zip(runs[SEPP_TRIO], runs[other], strict=False):
            if "error" in a or "error" in b:
                continue
            paired_thr.append((a["n"] / a["elapsed_s"]) / (b["n"] / b["elapsed_s"]))
            paired_cpu.append((a["cpu_s"] / a["n"]) / (b["cpu_s"] / b["n"]))
        summary["ratios"][other] = {
            "throughput": _median(paired_thr),
            "cpu_per_op": _median(paired_cpu),
            "throughput_per_round": paired_thr,
            "cpu_per_op_per_round": paired_cpu,
            "throughput_range": _spread(paired_thr),
            "cpu_per_op_range": _spread(paired_cpu),
        }
    return summary


def _spread(values: Sequence[float]) -> list[float] | None:
    """[min, max] of the per-round values: how far one round can be from the median."""
    clean = [v for v in values if v is not None and math.isfinite(v)]
    return [min(clean), max(clean)] if clean else None


def auto_batched_vs_batch(scenarios: dict[str, Any]) -> dict[str, Any]:
    """Each sepp-trio driver's auto-batched 64-task enqueue against each other client's
    enqueue_batch of 100, paired per round (the target compares them in the same run)."""
    if "enqueue_64_batched" not in scenarios or "enqueue_batch" not in scenarios:
        return {}
    batched = scenarios["enqueue_64_batched"]["runs"]
    batch = scenarios["enqueue_batch"]["runs"]
    out: dict[str, Any] = {}
    for mine in (c for c in batched if c.startswith(SEPP_TRIO)):
        for other in (c for c in batch if not c.startswith(SEPP_TRIO)):
            per_round = [
                (a["n"] / a["elapsed_s"]) / (b["n"] / b["elapsed_s"])
                for a, b in zip(batched[mine], batch[other], strict=False)
                if "error" not in a and "error" not in b
            ]
            out.setdefault(mine, {})[other] = {
                "throughput": _median(per_round),
                "throughput_per_round": per_round,
                "throughput_range": _spread(per_round),
            }
    return out


def summarise_latency(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    per_client: dict[str, Any] = {}
    for client, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        per_client[client] = {
            "p50_ms": _median([r["p50_ms"] for r in ok]),
            "p99_ms": _median([r["p99_ms"] for r in ok]),
            "p50_ms_all": [r["p50_ms"] for r in ok],
            "p99_ms_all": [r["p99_ms"] for r in ok],
            "errors": len(rs) - len(ok),
        }
    summary: dict[str, Any] = {"clients": per_client, "ratios": {}}
    if SEPP_TRIO in runs:
        for other in (c for c in runs if c != SEPP_TRIO):
            paired = [
                (a, b)
                for a, b in zip(runs[SEPP_TRIO], runs[other], strict=False)
                if "error" not in a and "error" not in b
            ]
            p50 = [_ratio(a["p50_ms"], b["p50_ms"]) for a, b in paired]
            p99 = [_ratio(a["p99_ms"], b["p99_ms"]) for a, b in paired]
            summary["ratios"][other] = {
                "p50": _ratio(per_client[SEPP_TRIO]["p50_ms"], per_client[other]["p50_ms"]),
                "p99": _ratio(per_client[SEPP_TRIO]["p99_ms"], per_client[other]["p99_ms"]),
                "p50_range": _spread([r for r in p50 if r is not None]),
                "p99_range": _spread([r for r in p99 if r is not None]),
            }
    return summary


# -- running ---------------------------------------------------------------------------------


async def preload(client: sepp.Client, queue: str, n: int, batch: int) -> None:
    payload = sepp.Payload(b"x" * PAYLOAD_SIZE, "application/octet-stream")
    left = n
    while left > 0:
        k = min(batch, left)
        results = await client.enqueue_batch(
            [sepp.EnqueueRequest(queue, "bench", payload=payload) for _ in range(k)]
        )
        if any(sepp.is_job_rejection(r) for r in results):
            raise RuntimeError(f"preloading {queue} was rejected: {results[0]}")
        left -= k


async def drain(client: sepp.Client, queue: str, n: int) -> None:
    """Reserve and ack up to `n` jobs of `queue` (until it is found empty)."""
    while n > 0:
        jobs = await client.reserve([queue], lease_duration=LEASE_S, wait_timeout=0.2, max_jobs=8)
        if not jobs:
            return
        n -= len(jobs)
        async with trio.open_nursery() as nursery:
            for job in jobs:
                nursery.start_soon(client.ack, job.ctx)


async def run_one(
    driver: DriverProcess,
    scenario: Scenario,
    queue: str,
    factor: float,
    loader: sepp.Client,
    enqueue_batch_max: int,
) -> dict[str, Any]:
    args, preload_n = scenario.build(factor)
    if preload_n:
        await preload(loader, queue, preload_n, enqueue_batch_max)
    try:
        result: dict[str, Any] = await driver.request(scenario.op, queue=queue, **args)
    except DriverFailed as exc:
        log(f"  {driver.name} {scenario.name}: FAILED: {exc}")
        return {"error": str(exc)}
    finally:
        if scenario.drain_after:
            await drain(loader, queue, int(args.get("n", 0)))
    if scenario.kind == "throughput":
        expected = args.get("n", args.get("n_batches", 0) * args.get("batch_size", 0))
        if result.get("n") != expected:
            log(f"  {driver.name} {scenario.name}: processed {result.get('n')} of {expected}")
    return result


async def run_fresh(
    spec: ClientSpec, scenario: Scenario, queue: str, addr: str, log_path: Path
) -> dict[str, Any]:
    """One measurement in a new driver process: connect, warm up, then the timed run."""
    args, _ = scenario.build(1.0)
    driver = DriverProcess(spec, log_path)
    try:
        await driver.start()
        await driver.request("connect", addr=addr, timeout=60)
        await driver.request(scenario.op, queue=f"{queue}.warm", **{**args, "n": FRESH_WARMUP})
        result: dict[str, Any] = await driver.request(scenario.op, queue=queue, **args)
    except DriverFailed as exc:
        log(f"  {spec.name} {scenario.name}: FAILED: {exc}")
        return {"error": str(exc)}
    finally:
        await driver.aclose()
    return result


def _fmt_result(scenario: Scenario, r: dict[str, Any]) -> str:
    if "error" in r:
        return "error"
    if scenario.kind == "latency":
        return f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms"
    return f"{r['n'] / r['elapsed_s']:,.0f}/s cpu {r['cpu_s'] / r['n'] * 1000:.3f} s/1k"


async def run_mode(
    mode: str,
    opts: Options,
    specs: list[ClientSpec],
    log_dir: Path,
    meta: dict[str, Any],
    static: dict[str, Any],
) -> dict[str, Any]:
    config = {"admin": {"enabled": False}, "storage": {"persist_mode": mode}}
    scenarios = [SCENARIOS[s] for s in opts.scenarios if s in SCENARIOS]
    out: dict[str, Any] = {"server_config": config, "scenarios": {}}
    async with sepp.testing.sepp_server(config) as server:
        addr = server.address
        log(f"[{mode}] sepp server at {addr} (pid {server.pid})")
        if "server" not in meta:
            meta["server"] = {
                "binary": server.binary,
                "version": _cmd_output([server.binary, "--version"]),
            }
        if {"import", "rss"} & set(opts.scenarios) and not static:
            await compile_bytecode(specs[0])
        if "import" in opts.scenarios and "import" not in static:
            static["import"] = await measure_import(specs, opts)
        if "rss" in opts.scenarios and "rss" not in static:
            static["rss"] = await measure_rss(specs, opts, addr)
        if not scenarios:
            return out
        drivers = [DriverProcess(s, log_dir / f"{mode}-{s.name}.log") for s in specs]
        try:
            for d in drivers:
                await d.start()
                info = await d.request("ping", timeout=60)
                meta["clients"].setdefault(d.name, {}).update(info or {})
                await d.request("connect", addr=addr, timeout=60)
            async with sepp.open(addr) as loader:
                server_info = await loader.get_server_info()
                batch_max = server_info.max_enqueue_batch
                log(f"[{mode}] warm-up")
                for scenario in (s for s in scenarios if not s.fresh):
                    for d in drivers:
                        if scenario.only and d.name not in scenario.only:
                            continue
                        q = f"warm.{mode}.{scenario.name}.{d.name}"
                        await run_one(d, scenario, q, 0.05, loader, batch_max)
                runs: dict[str, dict[str, list[dict[str, Any]]]] = {
                    s.name: {d.name: [] for d in drivers} for s in scenarios
                }
                contention: list[dict[str, float | None]] = []
                out["contention_per_round"] = contention
                for rnd in range(opts.rounds):
                    contention.append(contention_sample())
                    # Flip the order every round so neither client always goes first.
                    shift = rnd % len(drivers)
                    order = drivers[shift:] + drivers[:shift]
                    for scenario in scenarios:
                        parts = []
                        for d in order:
                            if scenario.only and d.name not in scenario.only:
                                continue
                            q = f"b.{mode}.{scenario.name}.r{rnd}.{d.name}"
                            if scenario.fresh:
                                fresh_log = log_dir / f"{mode}-{d.name}-fresh.log"
                                r = await run_fresh(d.spec, scenario, q, addr, fresh_log)
                            else:
                                r = await run_one(
                                    d, scenario, q, opts.size_factor, loader, batch_max
                                )
                            r["round"], r["position"] = rnd, order.index(d)
                            runs[scenario.name][d.name].append(r)
                            parts.append(f"{d.name} {_fmt_result(scenario, r)}")
                        log(
                            f"[{mode}] round {rnd + 1}/{opts.rounds} {scenario.name}: "
                            + " | ".join(parts)
                        )
            for scenario in scenarios:
                srun = runs[scenario.name]
                summary = (
                    summarise_latency(srun)
                    if scenario.kind == "latency"
                    else summarise_throughput(srun)
                )
                args, preload_n = scenario.build(opts.size_factor)
                out["scenarios"][scenario.name] = {
                    "title": scenario.title,
                    "kind": scenario.kind,
                    "op": scenario.op,
                    "args": args,
                    "preload": preload_n,
                    "summary": summary,
                    "runs": srun,
                }
            out["auto_batched_vs_batch"] = auto_batched_vs_batch(out["scenarios"])
        finally:
            for d in drivers:
                await d.aclose()
    return out


# What an application using each client has imported anyway: its event loop library. grpc,
# h2, hpack and protobuf are the clients' own dependencies, so they count as the client's cost.
EVENT_LOOP_MODULE = {SEPP_TRIO: "trio", SEPP_PY: "asyncio"}


async def compile_bytecode(spec: ClientSpec) -> None:
    """Write the checkout's .pyc files, as installing a wheel does. With PYTHONDONTWRITEBYTECODE
    set, every probe would otherwise compile src/sepp from source, while sepp-py and every
    installed library have had their bytecode since install."""
    argv = [spec.driver_argv[0], "-m", "compileall", "-q", str(SRC / "sepp")]
    await trio.run_process(argv, env=spec.env, capture_stdout=True, capture_stderr=True)


async def measure_import(specs: list[ClientSpec], opts: Options) -> dict[str, Any]:
    log(f"import time: {opts.import_runs} fresh interpreters per client and kind, alternating")
    probes = [s for s in specs if s.probe_argv is not None]
    # alone: `import sepp` in a bare interpreter; on_top: after EVENT_LOOP_MODULE[client].
    kinds = ("alone", "on_top")
    samples: dict[str, dict[str, list[float]]] = {k: {s.name: [] for s in probes} for k in kinds}
    cpu: dict[str, dict[str, list[float]]] = {k: {s.name: [] for s in probes} for k in kinds}

    def argv(s: ClientSpec, kind: str) -> list[str]:
        after = ["--after", EVENT_LOOP_MODULE[s.name]] if kind == "on_top" else []
        return probe_args(s, "import", *after, otel=opts.otel)

    for s in probes:  # discarded: warms the page cache
        await run_json(argv(s, "alone"), s.env)
    for i in range(opts.import_runs):
        for kind in kinds:
            for s in probes if i % 2 == 0 else probes[::-1]:
                res = await run_json(argv(s, kind), s.env)
                samples[kind][s.name].append(res["import_s"] * 1000.0)
                cpu[kind][s.name].append(res["import_cpu_s"] * 1000.0)
    out = _static_summary(samples["alone"], "ms")
    out["on_top"] = _static_summary(samples["on_top"], "ms")
    for kind, summary in (("alone", out), ("on_top", out["on_top"])):
        for name, values in cpu[kind].items():
            summary["clients"][name]["cpu_median"] = _median(values)
            summary["clients"][name]["cpu_all"] = values
    out["on_top"]["after"] = {s.name: EVENT_LOOP_MODULE[s.name] for s in probes}
    return out


async def measure_rss(specs: list[ClientSpec], opts: Options, addr: str) -> dict[str, Any]:
    runs = 3
    log(f"idle RSS after connecting: {runs} fresh processes per client")
    probes = [s for s in specs if s.probe_argv is not None]
    samples: dict[str, list[float]] = {s.name: [] for s in probes}
    base: dict[str, list[float]] = {s.name: [] for s in probes}
    after_import: dict[str, list[float]] = {s.name: [] for s in probes}
    for i in range(runs):
        for s in probes if i % 2 == 0 else probes[::-1]:
            res = await run_json(probe_args(s, "idle", addr, otel=opts.otel), s.env)
            samples[s.name].append(res["rss_bytes"] / 2**20)
            base[s.name].append(res["base_rss_bytes"] / 2**20)
            after_import[s.name].append((res["first_call_s"] - res["import_s"]) * 1000.0)
    out = _static_summary(samples, "MiB")
    for name, values in base.items():
        out["clients"][name]["interpreter_base_mib"] = _median(values)
    out["first_call"] = _static_summary(after_import, "ms")
    return out


def _static_summary(samples: dict[str, list[float]], unit: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "unit": unit,
        "clients": {name: {"median": _median(v), "all": v} for name, v in samples.items()},
        "ratios": {},
    }
    if SEPP_TRIO in samples:
        mine = out["clients"][SEPP_TRIO]["median"]
        for other in (n for n in samples if n != SEPP_TRIO):
            out["ratios"][other] = _ratio(mine, out["clients"][other]["median"])
    return out


# -- reporting -------------------------------------------------------------------------------


def _f(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def render_markdown(results: dict[str, Any]) -> str:
    tables = _render_tables(results)
    if "platform" in results:
        from . import platforms

        tables = f"{tables}\n\n{platforms.render(results['platform'])}"
    if "cores" in results:
        from . import cores

        tables = f"{tables}\n\n{cores.render(results['cores'])}"
    if "memory" in results:
        from . import memory_server

        tables = f"{tables}\n\n{memory_server.render(results['memory'])}"
    return tables


def _render_tables(results: dict[str, Any]) -> str:
    meta = results["meta"]
    clients: list[str] = meta["client_names"]
    others = [c for c in clients if c != SEPP_TRIO]
    lines: list[str] = []
    m = meta["machine"]
    lines.append(
        f"Run {meta['date']} on {m['nproc']} CPUs ({m['cpu_model']}, Linux {m['kernel']}), "
        f"load average {m['loadavg_start'][0]:.2f} at start, "
        f"{meta['rounds']} rounds, size factor {meta['size_factor']}, "
        f"OpenTelemetry {'importable' if meta['otel'] else 'blocked'} in both clients, "
        f"took {meta['duration_s'] / 60:.1f} min."
    )
    git = meta.get("git", {})
    if git:
        dirty = git.get("dirty_paths", 0)
        lines.append("")
        lines.append(
            f"sepp-trio at git {git.get('commit', '?')}"
            + (f" with {dirty} uncommitted path(s) under src/." if dirty else ".")
        )
    pressures = [
        c.get("cpu_pressure_some_avg10")
        for m in results["modes"].values()
        for c in m.get("contention_per_round", [])
        if c.get("cpu_pressure_some_avg10") is not None
    ]
    if pressures:
        lines.append(
            f"CPU pressure (PSI some, avg10) at round starts: {min(pressures):.0f}-"
            f"{max(pressures):.0f} % (the machine is shared)."
        )
    lines.append("")
    lines.append(
        "Each ratio is the median of the per-round ratios, with their range over the rounds"
        " (min-max) in brackets: a ratio is only known to within that range."
    )
    lines.append("")
    lines.append(f"Command: `{meta['command']}`")
    lines.append("")
    lines.append("Versions: " + versions_line(meta) + ".")
    lines.append("")
    for mode, mres in results["modes"].items():
        scen = mres["scenarios"]
        thr = [(k, v) for k, v in scen.items() if v["kind"] == "throughput"]
        if thr:
            head = ["scenario (`persist_mode=" + mode + "`)"]
            for c in clients:
                head.append(f"{c} ops/s")
            for o in others:
                head.append(f"trio/{_label(o)}")
            for c in clients:
                head.append(f"{c} CPU s/1k")
            for o in others:
                head.append(f"CPU trio/{_label(o)}")
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            for _, v in thr:
                s = v["summary"]
                row = [v["title"]]
                for c in clients:
                    row.append(_f(s["clients"].get(c, {}).get("ops_per_s"), ",.0f"))
                for o in others:
                    row.append(_ratio_cell(s["ratios"].get(o, {}), "throughput"))
                for c in clients:
                    row.append(_f(s["clients"].get(c, {}).get("cpu_s_per_1k"), ".3f"))
                for o in others:
                    row.append(_ratio_cell(s["ratios"].get(o, {}), "cpu_per_op"))
                lines.append("| " + " | ".join(row) + " |")
            lines.append("")
            costs = [
                f"{v['title']}: "
                + ", ".join(
                    f"{base} {_f(cost['cpu_per_op'], '.2f')}x"
                    for base, cost in v["summary"].get("otel_api_cost", {}).items()
                )
                for _, v in thr
                if v["summary"].get("otel_api_cost")
            ]
            if costs:
                lines.append(
                    "- CPU per op with opentelemetry-api importable and no provider set, over"
                    " the same client without it (median of per-round ratios): " + "; ".join(costs)
                )
                lines.append("")
            derived = mres.get("auto_batched_vs_batch", {})
            for mine, against in derived.items():
                for other, ratio in against.items():
                    lines.append(
                        f"- auto-batched vs {other} enqueue_batch: {mine}'s auto-batched 64-task"
                        f" enqueue reaches {_ratio_cell(ratio, 'throughput')}x {other}'s"
                        " enqueue_batch of 100 (jobs/s, median of per-round ratios)"
                    )
            if derived:
                lines.append("")
        lat = [(k, v) for k, v in scen.items() if v["kind"] == "latency"]
        for _, v in lat:
            s = v["summary"]
            head = [f"latency (`{mode}`), ms"]
            for c in clients:
                head += [f"{c} p50", f"{c} p99"]
            for o in others:
                head += [f"p50 trio/{_label(o)}", f"p99 trio/{_label(o)}"]
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            row = [v["title"]]
            for c in clients:
                cs = s["clients"].get(c, {})
                row += [_f(cs.get("p50_ms"), ".2f"), _f(cs.get("p99_ms"), ".2f")]
            for o in others:
                rs = s["ratios"].get(o, {})
                row += [_ratio_cell(rs, "p50"), _ratio_cell(rs, "p99")]
            lines.append("| " + " | ".join(row) + " |")
            lines.append("")
    static = results.get("static", {})
    if static:
        names = [c for c in clients if c in (SEPP_TRIO, SEPP_PY)]
        head = ["fresh process", *names, "trio/py"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))

        def static_row(title: str, st: dict[str, Any], key: str = "median") -> None:
            row = [title]
            for c in names:
                cs = st["clients"].get(c, {})
                cell = _f(cs.get(key), ".1f")
                if "cpu_median" in cs:
                    cell += f" ({_f(cs['cpu_median'], '.1f')} CPU)"
                row.append(cell)
            row.append(_f(st["ratios"].get(SEPP_PY), ".2f") if key == "median" else "")
            lines.append("| " + " | ".join(row) + " |")

        if "import" in static:
            static_row("`import sepp`, ms (median; CPU ms)", static["import"])
            if "on_top" in static["import"]:
                after = " / ".join(
                    f"`{static['import']['on_top']['after'][c]}`"
                    for c in names
                    if c in static["import"]["on_top"]["after"]
                )
                static_row(
                    f"`import sepp` after its event loop library ({after}), ms (CPU ms)",
                    static["import"]["on_top"],
                )
        if "rss" in static:
            static_row("idle RSS after connecting, MiB", static["rss"])
            static_row(
                "(interpreter before `import sepp`, MiB)", static["rss"], "interpreter_base_mib"
            )
            if "first_call" in static["rss"]:
                static_row(
                    "connect + first call, after `import sepp`, ms (median of 3)",
                    static["rss"]["first_call"],
                )
        lines.append("")
    return "\n".join(lines)


def _ratio_cell(ratios: dict[str, Any], key: str) -> str:
    """The median ratio and, when there are rounds to compare, their range: 1.52 (1.31-1.70)."""
    cell = _f(ratios.get(key), ".2f")
    spread = ratios.get(f"{key}_range")
    if spread and ratios.get(key) is not None:
        cell += f" ({spread[0]:.2f}-{spread[1]:.2f})"
    return cell


def _label(client: str) -> str:
    """Short column label: sepp-py -> py, sepp-rs -> rs, sepp-trio+x -> +x."""
    if client.startswith(f"{SEPP_TRIO}+"):
        return client[len(SEPP_TRIO) :]
    base, plus, variant = client.partition("+")
    return base.split("-")[-1] + plus + variant


def versions_line(meta: dict[str, Any]) -> str:
    t = meta["clients"].get(SEPP_TRIO, {})
    p = meta["clients"].get(SEPP_PY, {})
    r = meta["clients"].get(SEPP_RS, {})
    parts = [
        f"Python {t.get('python', p.get('python', '?'))}",
        f"sepp-trio {t.get('sepp_trio_version', '?')}",
        f"h2 {t.get('h2', '?')}",
        f"hpack {t.get('hpack', '?')}",
        f"trio {t.get('trio', '?')}",
        f"protobuf {t.get('protobuf', '?')} ({t.get('protobuf_impl', '?')})",
        f"sepp-py {p.get('sepp_py_version', '?')}",
        f"grpcio {p.get('grpcio', '?')}",
        f"sepp-py's protobuf {p.get('protobuf', '?')} ({p.get('protobuf_impl', '?')})",
        f"server {meta.get('server', {}).get('version', '?')}",
    ]
    if r:
        parts.append(f"sepp-rs {r.get('sepp_rs_version', '?')} (tokio current-thread)")
    return ", ".join(parts)


def update_readme(markdown: str) -> None:
    text = README.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{README} lacks the {README_START} / {README_END} markers")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    README.write_text(f"{head}{README_START}\n{markdown}\n{README_END}{tail}", encoding="utf-8")


# -- main ------------------------------------------------------------------------------------


async def amain(opts: Options) -> dict[str, Any]:
    started = time.monotonic()
    seppy_python = ensure_seppy_python(opts)
    specs = [trio_spec(sys.executable, otel=opts.otel)]
    if SEPP_PY in opts.clients:
        specs.append(seppy_spec(seppy_python, otel=opts.otel))
    if SEPP_RS in opts.clients:
        specs.append(rs_spec(ensure_rs_binary()))
    for name in opts.clients:
        if name == f"{SEPP_PY}+{OTEL_API}":
            specs.append(seppy_spec(seppy_python, otel=opts.otel, otel_api_variant=True))
        elif name.startswith(f"{SEPP_TRIO}+"):
            experiment = name.split("+", 1)[1]
            specs.append(trio_spec(sys.executable, otel=opts.otel, experiment=experiment))
    seppy_impl = await run_json(
        [
            seppy_python,
            "-I",
            "-c",
            "import json; from google.protobuf.internal import api_implementation as a; "
            "print(json.dumps(a.Type()))",
        ],
        specs[0].env,
    )
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": opts.command,
        "rounds": opts.rounds,
        "quick": opts.quick,
        "size_factor": opts.size_factor,
        "otel": opts.otel,
        "payload_size": PAYLOAD_SIZE,
        "machine": machine_info(),
        "git": {
            "commit": _cmd_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
            "dirty_paths": len(
                _cmd_output(["git", "-C", str(REPO), "status", "--porcelain", "src"]).splitlines()
            ),
        },
        "client_names": [s.name for s in specs],
        "clients": {SEPP_PY: {"protobuf_impl": seppy_impl}},
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = RESULTS_DIR / "logs" / stamp
    results: dict[str, Any] = {"meta": meta, "modes": {}, "static": {}}
    for mode in opts.modes:
        results["modes"][mode] = await run_mode(mode, opts, specs, log_dir, meta, results["static"])
    if opts.platform:
        from . import platforms

        log("platform section (benchmarks/platforms.py)")
        jobs, big_jobs = (1000, 30) if opts.quick else (2000, 60)
        results["platform"] = await platforms.measure(opts.rounds, jobs, big_jobs, log_dir)
    if "cores" in opts.scenarios:
        from . import cores

        log("every-core section (benchmarks/cores.py)")
        jobs = 100 if opts.quick else 200
        results["cores"] = await cores.measure(min(opts.rounds, 3), jobs, 30.0)
    if "memory" in opts.scenarios:
        from . import memory_server

        log("memory-server section (benchmarks/memory_server.py)")
        results["memory"] = await memory_server.measure(opts.rounds, 1000)
    meta["machine"]["loadavg_end"] = list(os.getloadavg())
    meta["duration_s"] = time.monotonic() - started
    meta["driver_logs"] = str(log_dir.relative_to(REPO))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    results = trio.run(amain, opts)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = opts.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(opts.out)
    markdown = render_markdown(results)
    md_path = opts.out.with_suffix(".md")
    md_path.write_text(markdown + "\n", encoding="utf-8")
    print(markdown)
    log(f"wrote {opts.out} and {md_path}")
    if opts.update_readme:
        update_readme(markdown)
        log(f"updated {README}")
    return 0
