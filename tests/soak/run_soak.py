"""Soak run (`make soak`): a long-lived client process behind nginx, through restarts.

    PYTHONPATH=src:tests .venv/bin/python tests/soak/run_soak.py [--minutes 30]
        [--restarts 5] [--reloads 6] [--rate 40] [--results tests/soak/RESULTS.md]

For `--minutes`, this one process runs producers (single enqueues and batches, every job
keyed, a failed call retried with the same key), a `sepp.Worker` and idle long-polls, all
through nginx (the config in docs/proxies/, its defaults: a GOAWAY every 1,000 calls per
connection): producers and long-polls over h2c, the Worker over TLS ended at nginx. Meanwhile
the sepp server (`persist_mode = "sync_data"`) is restarted on its data dir and nginx is
reloaded, spread over the run. Every few seconds it samples its own RSS, open file
descriptors and live trio tasks. At the end it stops producing, waits for the Worker to
finish every acked job, and reports:

- RSS, open fds and live trio tasks after warm-up: the median of the first samples after
  warm-up against the median of the last ones; RSS and fds must grow by under 5 %, and the
  task count (which moves with the handlers running) must end no higher than its first
  samples' peak;
- jobs lost (an acked enqueue never processed: must be 0) and duplicates (at-least-once:
  a job whose ack failed while the server was down runs again);
- failed calls, split into those during a server outage (expected: the server is down) and
  those at any other time (must be 0: nginx reloads and GOAWAYs must not fail a call).

Bookkeeping is preallocated (one byte per job), so the harness itself does not grow.
Exit status 1 if any promise was broken.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import trio
from chaos import harness
from fixtures.proxies import nginx_proxy

import sepp
from sepp.testing import SEPP_SERVER_VERSION, SeppServer, sepp_server

QUEUE = "soak"
IDLE_QUEUE = "soak-idle"
SAMPLE_EVERY_S = 5.0
# After a restart the server is back, but connections through nginx still settle.
OUTAGE_GRACE_S = 3.0
DRAIN_TIMEOUT_S = 180.0
MAX_GROWTH = 0.05


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="sepp-trio soak run behind nginx")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--warmup-minutes", type=float, default=None, help="default: a sixth")
    p.add_argument("--restarts", type=int, default=5, help="sepp server restarts")
    p.add_argument("--reloads", type=int, default=6, help="nginx reloads")
    p.add_argument("--rate", type=float, default=40.0, help="jobs enqueued per second")
    p.add_argument("--idle-polls", type=int, default=8, help="idle long-poll tasks")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--results", type=Path, default=None, help="write figures here (Markdown)")
    return p.parse_args(argv)


# -- what the process measures about itself ------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def live_trio_tasks() -> int:
    count, stack = 0, [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


@dataclass(frozen=True)
class Sample:
    t: float
    rss: int
    fds: int
    tasks: int


@dataclass
class Growth:
    name: str
    baseline: float
    final: float
    peak: float

    @property
    def ratio(self) -> float:
        return (self.final - self.baseline) / self.baseline if self.baseline else 0.0

    def row(self, unit: str = "", scale: float = 1.0) -> str:
        def show(value: float) -> str:
            return f"{value / scale:,.1f}{unit}" if scale != 1.0 else f"{value:g}{unit}"

        return (
            f"| {self.name} | {show(self.baseline)} | {show(self.final)} | {show(self.peak)}"
            f" | {self.ratio:+.1%} |"
        )


def growth(name: str, samples: list[Sample], attr: str, window: int) -> Growth:
    values = [getattr(s, attr) for s in samples]
    return Growth(
        name,
        statistics.median(values[:window]),
        statistics.median(values[-window:]),
        max(values),
    )


# -- the run -------------------------------------------------------------------------------------


class BoundedLog:
    """A LoggerLike that counts warnings/errors (outage or not) and keeps only a few."""

    def __init__(self, soak: Soak) -> None:
        self._soak = soak
        self.counts: Counter[str] = Counter()
        self.examples: list[str] = []

    def _add(self, level: str, msg: str, args: tuple[object, ...]) -> None:
        when = "outage" if self._soak.in_outage() else "steady"
        self.counts[f"{level} ({when})"] += 1
        if when == "steady" and len(self.examples) < 5:
            self.examples.append(f"{level}: {msg % args if args else msg}")

    def debug(self, msg: str, *args: object, **kwargs: object) -> None:
        pass

    def info(self, msg: str, *args: object, **kwargs: object) -> None:
        pass

    def warning(self, msg: str, *args: object, **kwargs: object) -> None:
        self._add("warning", msg, args)

    def error(self, msg: str, *args: object, **kwargs: object) -> None:
        self._add("error", msg, args)


@dataclass
class Soak:
    args: argparse.Namespace
    rng: random.Random
    capacity: int
    acked: bytearray = field(init=False)
    handled: bytearray = field(init=False)
    next_job: int = 0
    outage_until: float = 0.0  # trio time; inf while the server is down
    failures: Counter[str] = field(default_factory=Counter)
    idle_polls_done: int = 0
    samples: list[Sample] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    producing: bool = True

    def __post_init__(self) -> None:
        self.acked = bytearray(self.capacity)
        self.handled = bytearray(self.capacity)

    def in_outage(self) -> bool:
        return trio.current_time() < self.outage_until

    def failed(self, what: str, exc: BaseException) -> None:
        when = "outage" if self.in_outage() else "steady"
        self.failures[f"{what}: {harness._error_name(exc)} ({when})"] += 1

    def steady_failures(self) -> int:
        return sum(n for k, n in self.failures.items() if k.endswith("(steady)"))

    def unprocessed(self) -> int:
        """Acked jobs the Worker has not handled (yet)."""
        return sum(1 for a, h in zip(self.acked, self.handled, strict=True) if a and not h)

    def take_jobs(self, n: int) -> range:
        start = self.next_job
        self.next_job = min(self.capacity, start + n)
        return range(start, self.next_job)


def _request(index: int) -> sepp.EnqueueRequest:
    return sepp.EnqueueRequest(
        QUEUE,
        "soak",
        payload=sepp.Payload.bytes(b"%d" % index),
        idempotency_key=f"soak-{index}",
        max_attempts=25,
    )


async def produce_singles(soak: Soak, client: sepp.Client, period_s: float) -> None:
    while soak.producing:
        for index in soak.take_jobs(1):
            while soak.producing:
                try:
                    await client.enqueue(_request(index))
                except sepp.SeppError as exc:
                    soak.failed("enqueue", exc)
                    await trio.sleep(0.2)
                    continue
                soak.acked[index] = 1
                break
        await trio.sleep(period_s)


async def produce_batches(soak: Soak, client: sepp.Client, size: int, period_s: float) -> None:
    while soak.producing:
        pending = list(soak.take_jobs(size))
        while pending and soak.producing:
            try:
                results = await client.enqueue_batch([_request(i) for i in pending])
            except sepp.SeppError as exc:
                soak.failed("enqueue_batch", exc)
                await trio.sleep(0.2)
                continue
            retry = []
            for index, result in zip(pending, results, strict=True):
                if sepp.is_job_rejection(result):
                    retry.append(index)
                else:
                    soak.acked[index] = 1
            pending = retry
        await trio.sleep(period_s)


async def idle_long_poll(soak: Soak, client: sepp.Client) -> None:
    while True:
        try:
            jobs = await client.reserve(IDLE_QUEUE, lease_duration=30, wait_timeout=20)
        except sepp.SeppError as exc:
            soak.failed("idle reserve", exc)
            await trio.sleep(0.5)
            continue
        if jobs:
            raise AssertionError(f"the idle queue had jobs: {jobs}")
        soak.idle_polls_done += 1


async def sampler(soak: Soak) -> None:
    began = trio.current_time()
    while True:
        soak.samples.append(
            Sample(trio.current_time() - began, rss_bytes(), open_fds(), live_trio_tasks())
        )
        await trio.sleep(SAMPLE_EVERY_S)


def schedule(args: argparse.Namespace, run_s: float) -> list[tuple[float, str]]:
    """Restarts and reloads spread over [10 %, 80 %] of the run, interleaved."""
    moments: list[tuple[float, str]] = []
    for count, kind in ((args.restarts, "restart"), (args.reloads, "reload")):
        for i in range(count):
            moments.append((run_s * (0.1 + 0.7 * (i + 0.5) / count), kind))
    return sorted(moments)


async def disrupt(soak: Soak, server: SeppServer, proxy: Any, run_s: float) -> None:
    began = trio.current_time()
    for at, kind in schedule(soak.args, run_s):
        await trio.sleep_until(began + at)
        if kind == "reload":
            await proxy.reload()
            soak.events.append(f"{trio.current_time() - began:.0f}s nginx reload")
            continue
        soak.outage_until = float("inf")
        t0 = trio.current_time()
        await server.stop()
        await trio.sleep(soak.rng.uniform(0.5, 2.0))
        await server.start()
        soak.outage_until = trio.current_time() + OUTAGE_GRACE_S
        soak.events.append(
            f"{t0 - began:.0f}s server restart (down {trio.current_time() - t0:.1f}s)"
        )


async def run(args: argparse.Namespace, workdir: Path) -> tuple[Soak, dict[str, Any]]:
    seed = args.seed if args.seed is not None else harness.new_seed()
    run_s = args.minutes * 60
    capacity = int(args.rate * run_s * 1.2) + 10_000
    soak = Soak(args, random.Random(seed), capacity)
    log = BoundedLog(soak)
    handler_runs = 0
    print(f"soak: {args.minutes:g} min, seed {seed}, workdir {workdir}", flush=True)

    async with (
        sepp_server(harness.server_config(), data_dir=workdir / "data") as server,
        nginx_proxy(server.address, workdir / "nginx") as proxy,
        sepp.open(proxy.h2c_address, logger=log) as producer,
        sepp.open(proxy.h2c_address, logger=log) as poller,
        sepp.open(proxy.tls_address, logger=log, **proxy.tls_options()) as consumer,
    ):
        worker = sepp.Worker(consumer, QUEUE, lease_duration=30, max_in_flight=16, logger=log)

        @worker.handler("soak")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            nonlocal handler_runs
            assert payload is not None
            index = int(payload.data)
            soak.handled[index] = min(255, soak.handled[index] + 1)
            handler_runs += 1
            await trio.sleep(soak.rng.uniform(0, 0.005))

        singles, batch_size, batch_every_s = 6, 20, 2.0
        single_rate = max(args.rate - batch_size / batch_every_s, 1.0)
        background = trio.CancelScope()

        async def in_background() -> None:
            with background:
                async with trio.open_nursery() as tasks:
                    tasks.start_soon(sampler, soak)
                    for _ in range(args.idle_polls):
                        tasks.start_soon(idle_long_poll, soak, poller)

        began = trio.current_time()
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            nursery.start_soon(in_background)
            async with trio.open_nursery() as producers:
                for _ in range(singles):
                    producers.start_soon(produce_singles, soak, producer, singles / single_rate)
                producers.start_soon(produce_batches, soak, producer, batch_size, batch_every_s)
                await disrupt(soak, server, proxy, run_s)
                await trio.sleep_until(began + run_s)
                soak.producing = False
            background.cancel()
            print(f"soak: producing stopped after {trio.current_time() - began:.0f}s", flush=True)
            drain_s = await wait_drained(soak)
            worker.shutdown()
        tasks_after = live_trio_tasks()

    counts = Counter(min(n, 2) for n in soak.handled[: soak.next_job])
    acked = sum(soak.acked[: soak.next_job])
    lost = soak.unprocessed()
    figures = {
        "seed": seed,
        "jobs acked": acked,
        "jobs processed": counts[1] + counts[2],
        "lost": lost,
        "duplicates": counts[2],
        "extra handler runs": handler_runs - counts[1] - counts[2],
        "committed, ack never seen (producing stopped)": sum(
            1 for a, h in zip(soak.acked, soak.handled, strict=True) if h and not a
        ),
        "drain after producing stopped (s)": round(drain_s, 1) if drain_s is not None else None,
        "idle long-polls completed": soak.idle_polls_done,
        "trio tasks after shutdown": tasks_after,
    }
    return soak, {"figures": figures, "log": log}


async def wait_drained(soak: Soak) -> float | None:
    """Seconds until every acked job was handled, or None after DRAIN_TIMEOUT_S."""
    began = trio.current_time()
    with trio.move_on_after(DRAIN_TIMEOUT_S):
        while True:
            if not soak.unprocessed():
                return trio.current_time() - began
            await trio.sleep(1.0)
    return None


# -- the report ----------------------------------------------------------------------------------


def evaluate(soak: Soak, result: dict[str, Any]) -> tuple[list[Growth], list[str]]:
    args = soak.args
    warmup_s = (args.warmup_minutes if args.warmup_minutes is not None else args.minutes / 6) * 60
    after = [s for s in soak.samples if s.t >= warmup_s]
    window = max(3, min(12, len(after) // 6))
    problems: list[str] = []
    if len(after) < 2 * window:
        return [], [f"only {len(after)} samples after warm-up: run longer"]
    rows = [
        growth("RSS", after, "rss", window),
        growth("open fds", after, "fds", window),
        growth("live trio tasks", after, "tasks", window),
    ]
    for row in rows[:2]:
        if row.ratio >= MAX_GROWTH:
            problems.append(f"{row.name} grew {row.ratio:.1%} after warm-up")
    # The task count moves with the jobs and calls in flight (a handler task per job, up to
    # 16): a leak shows as an end median above every sample of the first window.
    first_window_peak = max(s.tasks for s in after[:window])
    if rows[2].final > first_window_peak:
        problems.append(
            f"live trio tasks: median {rows[2].final:g} at the end, above the first"
            f" window's peak {first_window_peak}"
        )
    figures = result["figures"]
    if figures["lost"]:
        problems.append(f"{figures['lost']} acked jobs were never processed")
    if figures["drain after producing stopped (s)"] is None:
        problems.append(f"jobs still unprocessed {DRAIN_TIMEOUT_S:g}s after producing stopped")
    if soak.steady_failures():
        problems.append(f"{soak.steady_failures()} calls failed while the server was up")
    log: BoundedLog = result["log"]
    steady_logs = sum(n for k, n in log.counts.items() if k.endswith("(steady)"))
    if steady_logs:
        problems.append(f"{steady_logs} worker/client warnings while the server was up")
    return rows, problems


def results_markdown(
    soak: Soak, result: dict[str, Any], rows: list[Growth], problems: list[str]
) -> str:
    args = soak.args
    figures = result["figures"]
    log: BoundedLog = result["log"]
    warmup = args.warmup_minutes if args.warmup_minutes is not None else args.minutes / 6
    lines = [
        "# Soak run results",
        "",
        "Figures of one run of `make soak` (tests/soak/run_soak.py), written by the run itself.",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}; sepp-trio {sepp.__version__};"
        f" sepp server {SEPP_SERVER_VERSION}; Python {platform.python_version()};"
        f" {platform.system()} {platform.machine()}",
        f"- Command: `{' '.join(['run_soak.py', *sys.argv[1:]])}`",
        f"- Verdict: {'PASS' if not problems else 'FAIL'}",
        "",
        f"One client process for {args.minutes:g} minutes, everything through nginx"
        " (docs/proxies/nginx-sepp.conf.template, keepalive_requests 1000): producers"
        f" ({args.rate:g} jobs/s, single enqueues and batches of 20, every job keyed, a"
        " failed call retried with the same key) and"
        f" {args.idle_polls} idle long-polls (20 s) over h2c, a `sepp.Worker` (16 in flight)"
        f' over TLS ended at nginx. The sepp server (`persist_mode = "sync_data"`) was'
        f" restarted {args.restarts} times on its data dir (SIGTERM, which waits for its"
        " connections to close, then 0.5-2 s down) and nginx"
        f" reloaded {args.reloads} times. Events: {'; '.join(soak.events)}.",
        "",
        f"## The client process after {warmup:g} minutes of warm-up",
        "",
        f"Medians of the first and of the last samples (every {SAMPLE_EVERY_S:g} s) after"
        " warm-up; flat means under 5 % growth. The task count moves with the jobs and calls"
        " in flight (a task per running handler), so for tasks flat means the median at the"
        " end is no higher than the highest count of the first samples.",
        "",
        "| measure | after warm-up | at the end | peak | growth |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(row.row(" MiB", 1024 * 1024) if row.name == "RSS" else row.row())
    lines += ["", "## Jobs and calls", "", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in figures.items()]
    steady = {k: n for k, n in soak.failures.items() if k.endswith("(steady)")}
    outage = {k: n for k, n in soak.failures.items() if k.endswith("(outage)")}
    lines += [
        f"| failed calls while the server was up (must be 0) | {sum(steady.values())} |",
        f"| failed calls during a server outage (+{OUTAGE_GRACE_S:g} s) | {sum(outage.values())} |",
        "",
        f"Failed calls by kind: {dict(soak.failures) or 'none'}. Warnings and errors logged by"
        f" the clients and the Worker: {dict(log.counts) or 'none'}"
        + (f"; while the server was up, e.g. {log.examples}" if log.examples else "")
        + ".",
        "",
        "Reading the figures: a call that fails while the server is down is expected (the"
        " producer retries it with the same key; nginx answers 502, which is UNAVAILABLE)."
        " Lost must be 0. A duplicate is a job whose first run finished but whose ack failed"
        " while the server was down, so it ran again: sepp is at-least-once.",
        "",
    ]
    lines += [f"- PROBLEM: {p}" for p in problems]
    return "\n".join(lines) + "\n"


async def run_until_signalled(
    args: argparse.Namespace, workdir: Path
) -> tuple[Soak, dict[str, Any]] | None:
    """`run`, but SIGTERM or SIGINT stops it cleanly (nginx and the server are stopped too),
    even when started in the background, where SIGINT is ignored."""
    outcome: tuple[Soak, dict[str, Any]] | None = None
    async with trio.open_nursery() as nursery:

        async def stop_on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    print(f"soak: stopped by signal {signum}", flush=True)
                    nursery.cancel_scope.cancel()

        nursery.start_soon(stop_on_signal)
        outcome = await run(args, workdir)
        nursery.cancel_scope.cancel()
    return outcome


def main() -> int:
    args = parse_args(sys.argv[1:])
    workdir = Path(tempfile.mkdtemp(prefix="sepp-soak-"))
    outcome = trio.run(run_until_signalled, args, workdir)
    if outcome is None:
        return 1
    soak, result = outcome
    rows, problems = evaluate(soak, result)
    text = results_markdown(soak, result, rows, problems)
    print(text)
    if args.results is not None:
        args.results.write_text(text, encoding="utf-8")
        print(f"figures written to {args.results}")
    print(f"logs and data in {workdir}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
