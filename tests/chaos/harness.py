"""Chaos runs against the real sepp server, shared by the CI test and the long run.

Three scenarios, each returning a `Report` (figures, plus the list of broken promises):

* `run_chaos`: producers in this process enqueue N uniquely keyed jobs (idempotency keys,
  four ways: `enqueue`, `enqueue_batch`, `enqueue_atomic`, auto-batched `enqueue`) while
  worker processes (`chaos_worker.py`, one `sepp.Worker` each) consume them, and the server
  (`persist_mode = "sync_data"`, one data dir) is SIGKILLed and restarted at seeded random
  moments. Afterwards: every acked enqueue was processed (lost = 0), duplicates are counted,
  failed enqueues were reported as failures, every worker is still the same process and
  processed jobs after the last restart, nothing logged a traceback, and SIGTERM makes every
  worker exit 0.
* `run_worker_kill`: a worker is SIGKILLed while its handlers run; its jobs come back when
  their (2 s) leases expire and another worker does them.
* `run_worker_sigterm`: a worker under load gets SIGTERM; it finishes what it started, exits
  0, and none of its jobs is redelivered.

Workers record what they do to per-worker append-only files (see chaos_worker.py); the
harness reads those files, never the workers' memory, so a SIGKILLed worker still counts.
"""

from __future__ import annotations

import bisect
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import trio
from fixtures.fake_client import RecordingLogger

import sepp
from sepp.testing import SeppServer, sepp_server

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
WORKER_SCRIPT = HERE / "chaos_worker.py"
QUEUE = "chaos"
# Far above what restarts can cost a job, so a dead letter means a bug, not bad luck.
JOB_MAX_ATTEMPTS = 25
READY_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 20.0
POLL_S = 0.05
# How long the probe phase may wait for a worker still backing off after the last restart
# (the Worker's reserve backoff is capped at 30 s).
PROBE_WINDOW_S = 45.0


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "big")


def server_config(**limits: int) -> dict[str, object]:
    return {
        "admin": {"enabled": False},
        "storage": {"persist_mode": "sync_data", "dead_letter_retention_ms": 600_000},
        "limits": {"max_wait_timeout_ms": 30_000, **limits},
    }


# -- reports -----------------------------------------------------------------------------------


@dataclass
class Report:
    """What a scenario measured (`figures`) and which promises it saw broken (`problems`)."""

    name: str
    seed: int
    figures: dict[str, object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    details: dict[str, object] = field(default_factory=dict)  # more figures, for the long run

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def summary(self) -> str:
        figures = ", ".join(f"{k}={v}" for k, v in self.figures.items())
        text = f"[chaos figures] {self.name} (seed={self.seed}): {figures}"
        if self.problems:
            text += "\n  PROBLEMS:\n" + "\n".join(f"  - {p}" for p in self.problems)
        return text


# -- worker processes and their records --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    kind: str
    t: float
    job_id: str
    attempt: int
    detail: str


def _parse(line: str) -> Record:
    kind, t, job_id, attempt, detail = line.split(" ", 4)
    return Record(kind, float(t), job_id, int(attempt) if attempt != "-" else 0, detail)


class Tail:
    """Reads the complete lines appended to a file since the last poll."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[Record]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [_parse(line.decode()) for line in lines if line]


@dataclass
class LogSummary:
    """What a worker's stderr says."""

    tracebacks: int
    lease_lost: int  # ERROR "lost the lease": acceptable under chaos, counted
    other_errors: list[str]
    warnings: int
    recoveries: int  # INFO "reserve works again"

    @classmethod
    def of(cls, text: str) -> LogSummary:
        lines = text.splitlines()
        errors = [line for line in lines if " ERROR " in line or " CRITICAL " in line]
        lost = [line for line in errors if "lost the lease" in line]
        return cls(
            tracebacks=text.count("Traceback"),
            lease_lost=len(lost),
            other_errors=[line for line in errors if line not in lost],
            warnings=sum(" WARNING " in line for line in lines),
            recoveries=sum("reserve works again" in line for line in lines),
        )


def _create(path: Path) -> IO[bytes]:
    return open(path, "wb")


def _make_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


class WorkerProc:
    """One chaos_worker.py process, its record file and its captured output."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.record = workdir / f"{name}.rec"
        self.out_path = workdir / f"{name}.out"
        self.err_path = workdir / f"{name}.err"
        self.tail = Tail(self.record)
        self.records: list[Record] = []
        self.done_ids: set[str] = set()  # jobs whose handler finished here (D records)
        self.proc: trio.Process | None = None
        self._files: list[IO[bytes]] = []

    async def spawn(self, addr: str, *options: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self._files = [_create(self.out_path), _create(self.err_path)]  # closed in reap()
        out, err = self._files
        command = [sys.executable, str(WORKER_SCRIPT), addr, str(self.record)]
        self.proc = await trio.lowlevel.open_process(
            [*command, "--name", self.name, *options],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
        )

    def update(self) -> list[Record]:
        new = self.tail.poll()
        self.records += new
        self.done_ids.update(r.job_id for r in new if r.kind == "D")
        return new

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    async def wait_ready(self) -> None:
        with trio.move_on_after(READY_TIMEOUT_S):
            while not any(r.kind == "P" for r in self.records):
                if not self.alive:
                    break
                self.update()
                await trio.sleep(POLL_S)
            else:
                return
        raise RuntimeError(
            f"worker {self.name} did not become ready (exit status {self.returncode}):\n"
            + self.stderr()[-3000:]
        )

    def send(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait_exit(self, timeout: float = EXIT_TIMEOUT_S) -> int | None:
        assert self.proc is not None
        with trio.move_on_after(timeout):
            await self.proc.wait()
        return self.proc.returncode

    async def reap(self) -> None:
        """Kill the process if it still runs (after a failure) and close its files."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            with trio.CancelScope(shield=True):
                await self.proc.wait()
        for f in self._files:
            f.close()
        self.update()

    def stderr(self) -> str:
        try:
            return self.err_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def logs(self) -> LogSummary:
        return LogSummary.of(self.stderr())

    def of_kind(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]


def worker_options(
    *,
    lease: float,
    max_in_flight: int,
    sleep_ms: str,
    seed: int,
    shutdown_timeout: float = 10.0,
    extra: Iterable[str] = (),
) -> list[str]:
    return [
        "--queue",
        QUEUE,
        "--lease",
        str(lease),
        "--max-in-flight",
        str(max_in_flight),
        "--sleep-ms",
        sleep_ms,
        "--shutdown-timeout",
        str(shutdown_timeout),
        "--seed",
        str(seed),
        *extra,
    ]


async def poll_until(
    workers: Iterable[WorkerProc], done: Callable[[], bool], timeout: float
) -> bool:
    """Keep reading the workers' records until `done()` or `timeout`; returns `done()`."""
    workers = list(workers)
    with trio.move_on_after(timeout):
        while True:
            for w in workers:
                w.update()
            if done():
                return True
            await trio.sleep(POLL_S)
    return done()


def done_by(workers: Iterable[WorkerProc]) -> dict[str, list[tuple[str, Record]]]:
    """job id → [(worker name, D record)] for every handler that finished."""
    out: dict[str, list[tuple[str, Record]]] = defaultdict(list)
    for w in workers:
        for r in w.records:
            if r.kind == "D":
                out[r.job_id].append((w.name, r))
    return out


# -- producers ---------------------------------------------------------------------------------


@dataclass
class EnqueueLedger:
    """What the producers were told, per idempotency key."""

    acks: dict[str, list[sepp.EnqueueAck]] = field(default_factory=lambda: defaultdict(list))
    failed_attempts: Counter[str] = field(default_factory=Counter)  # key → failed tries
    errors: Counter[str] = field(default_factory=Counter)  # error class → count
    gave_up: set[str] = field(default_factory=set)
    by_mode: Counter[str] = field(default_factory=Counter)

    def ok(self, key: str, ack: sepp.EnqueueAck, mode: str) -> None:
        self.acks[key].append(ack)
        self.by_mode[mode] += 1

    def fail(self, keys: Iterable[str], error: str) -> None:
        for key in keys:
            self.failed_attempts[key] += 1
            self.errors[error] += 1

    def job_id(self, key: str) -> str | None:
        acks = self.acks.get(key)
        return acks[0].job_id if acks else None


def _error_name(exc: BaseException) -> str:
    if isinstance(exc, sepp.JobRejectedError):
        return f"JobRejected({type(exc.rejection).__name__})"
    code = getattr(exc, "code", None)
    return f"{type(exc).__name__}({code.name})" if code is not None else type(exc).__name__


def _request(key: str, job_type: str = "chaos") -> sepp.EnqueueRequest:
    return sepp.EnqueueRequest(
        QUEUE,
        job_type,
        payload=sepp.Payload.json({"key": key}),
        idempotency_key=key,
        max_attempts=JOB_MAX_ATTEMPTS,
    )


# Errors a producer retries with the same key: the server was down, or the answer was lost.
RETRIED = (sepp.ClientError, sepp.JobRejectedError, sepp.BatchValidationError)


class Producers:
    """Enqueues keys four ways, each key retried with the same idempotency key until it gets
    an ack or `give_up_at` passes."""

    MODES = ("single", "batch", "atomic", "auto")

    def __init__(self, addr: str, ledger: EnqueueLedger, rng: random.Random) -> None:
        self.addr = addr
        self.ledger = ledger
        self.rng = rng
        self.log = RecordingLogger()
        self.give_up_at = float("inf")
        # (unix time, error) of each open() that failed and was tried again
        self.open_failures: list[tuple[float, str]] = []

    @asynccontextmanager
    async def _open(self, **options: Any) -> AsyncIterator[sepp.Client]:
        """An open client. open() fails at once when it cannot connect (the server is down,
        or this process, starved on a loaded machine, read no SETTINGS within the connect
        timeout): it is tried again, as a producer would."""
        retry = sepp.RetryPolicy(max_attempts=3, initial_backoff=0.05, max_backoff=0.5)
        while True:
            stack = AsyncExitStack()
            opening = sepp.open(
                self.addr, retry_policy=retry, connect_timeout=2.0, logger=self.log, **options
            )
            try:
                client = await stack.enter_async_context(opening)
            except sepp.ConnectError as exc:
                if not self._trying():
                    raise
                self.open_failures.append((time.time(), str(exc)))
                await self._pause()
                continue
            async with stack:
                yield client
            return

    async def _pause(self) -> None:
        await trio.sleep(self.rng.uniform(0.05, 0.3))

    def _trying(self) -> bool:
        return trio.current_time() < self.give_up_at

    async def _one(self, client: sepp.Client, key: str, mode: str, job_type: str) -> None:
        while self._trying():
            try:
                ack = await client.enqueue(_request(key, job_type))
            except RETRIED as exc:
                self.ledger.fail([key], _error_name(exc))
                await self._pause()
                continue
            self.ledger.ok(key, ack, mode)
            return
        self.ledger.gave_up.add(key)

    async def _chunk(self, client: sepp.Client, keys: list[str], atomic: bool) -> None:
        mode = "atomic" if atomic else "batch"
        pending = keys
        while pending and self._trying():
            requests = [_request(k) for k in pending]
            try:
                if atomic:
                    results: list[Any] = await client.enqueue_atomic(requests)
                else:
                    results = await client.enqueue_batch(requests)
            except RETRIED as exc:
                self.ledger.fail(pending, _error_name(exc))
                await self._pause()
                continue
            retry: list[str] = []
            for key, result in zip(pending, results, strict=True):
                if sepp.is_job_rejection(result):
                    self.ledger.fail([key], f"Rejected({type(result).__name__})")
                    retry.append(key)
                else:
                    self.ledger.ok(key, result, mode)
            pending = retry
            if pending:
                await self._pause()
        self.ledger.gave_up.update(pending)

    async def run(self, keys: list[str], *, give_up_after: float, chunk: int = 25) -> None:
        """Enqueue `keys` (each key goes to one of the four modes) until all are acked."""
        self.give_up_at = trio.current_time() + give_up_after
        shares: dict[str, list[str]] = {m: [] for m in self.MODES}
        for i, key in enumerate(keys):
            shares[self.MODES[i % len(self.MODES)]].append(key)

        async def single() -> None:
            async with self._open() as client:
                await _pool(8, shares["single"], lambda k: self._one(client, k, "single", "chaos"))

        async def chunked(mode: str) -> None:
            items = shares[mode]
            chunks = [items[i : i + chunk] for i in range(0, len(items), chunk)]
            async with self._open() as client:
                await _pool(2, chunks, lambda c: self._chunk(client, c, mode == "atomic"))

        async def auto() -> None:
            batching = sepp.Batching(max_batch=64, max_delay=0.005)
            async with self._open(enqueue_batching=batching) as client:
                await _pool(32, shares["auto"], lambda k: self._one(client, k, "auto", "chaos"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(single)
            nursery.start_soon(chunked, "batch")
            nursery.start_soon(chunked, "atomic")
            nursery.start_soon(auto)

    async def probes(self, keys: list[str], give_up_after: float) -> None:
        self.give_up_at = trio.current_time() + give_up_after
        async with self._open() as client:
            await _pool(8, keys, lambda k: self._one(client, k, "probe", "probe"))


async def _pool(size: int, items: list[Any], fn: Callable[[Any], Any]) -> None:
    """Run `fn(item)` for every item, `size` at a time."""
    it: Iterator[Any] = iter(items)

    async def runner() -> None:
        for item in it:
            await fn(item)

    async with trio.open_nursery() as nursery:
        for _ in range(size):
            nursery.start_soon(runner)


# -- shared checks -----------------------------------------------------------------------------


def check_logs(report: Report, workers: Iterable[WorkerProc]) -> dict[str, LogSummary]:
    summaries = {w.name: w.logs() for w in workers}
    for name, s in summaries.items():
        report.check(s.tracebacks == 0, f"worker {name} logged {s.tracebacks} traceback(s)")
        report.check(
            not s.other_errors, f"worker {name} logged unexpected errors: {s.other_errors[:3]}"
        )
    return summaries


async def stop_gracefully(report: Report, workers: Iterable[WorkerProc]) -> float:
    """SIGTERM every worker (each must still be the process we started) and expect exit 0."""
    workers = list(workers)
    for w in workers:
        report.check(w.alive, f"worker {w.name} died during the run (status {w.returncode})")
        if w.alive:
            w.send(signal.SIGTERM)
    began = time.monotonic()
    for w in workers:
        code = await w.wait_exit()
        report.check(code == 0, f"worker {w.name} exit status after SIGTERM: {code}")
        w.update()
        report.check(bool(w.of_kind("X")), f"worker {w.name} did not finish run() cleanly")
    return time.monotonic() - began


async def queue_leftovers(addr: str) -> tuple[int, int]:
    """(jobs still ready in the queue, dead letters)."""
    async with sepp.open(addr) as client:
        ready = await client.reserve(QUEUE, lease_duration=1, wait_timeout=0, max_jobs=100)
        dead = await client.drain_dead_letters(queue=QUEUE, max=100)
    return len(ready or ()), len(dead)


# -- scenario 1: producers, workers and server crashes -----------------------------------------


@dataclass
class ChaosParams:
    jobs: int = 2000
    restarts: int = 2
    workers: int = 4
    seed: int = field(default_factory=new_seed)
    lease: float = 3.0
    max_in_flight: int = 16
    sleep_ms: str = "0:20"
    # Some jobs outlive a third of the lease, so leases are extended (and can be lost) while
    # the server is down.
    slow_fraction: float = 0.03
    slow_ms: str = "1500:4000"
    down_s: tuple[float, float] = (0.1, 3.0)
    timeout_s: float = 300.0


@dataclass
class Restart:
    kill_at: float  # unix time of the SIGKILL
    back_at: float  # unix time the restarted server accepted connections
    down_s: float
    enqueued: int  # acked keys at the kill
    processed: int  # distinct jobs done at the kill


async def run_chaos(params: ChaosParams, workdir: Path) -> Report:
    p = params
    report = Report(f"chaos {p.jobs} jobs / {p.restarts} restarts / {p.workers} workers", p.seed)
    rng = random.Random(p.seed)
    _make_dir(workdir)
    ledger = EnqueueLedger()
    workers = [WorkerProc(f"w{i}", workdir) for i in range(p.workers)]
    keys = [f"k{i:06d}" for i in range(p.jobs)]
    # Restart i fires once progress (acked enqueues + finished jobs, out of 2N) passes a point
    # drawn from the i-th of `restarts` equal slices of [0.05, 0.9]: some land while
    # producers still run, all leave work for after the last one.
    span = 0.85 / max(p.restarts, 1)
    points = [rng.uniform(0.05 + i * span, 0.05 + (i + 1) * span) for i in range(p.restarts)]
    restarts: list[Restart] = []
    producers = Producers("", ledger, random.Random(rng.random()))
    began = time.monotonic()

    async with sepp_server(server_config(), data_dir=workdir / "data") as server:
        producers.addr = server.address
        try:
            for w in workers:
                slow = ["--slow-fraction", str(p.slow_fraction), "--slow-ms", p.slow_ms]
                opts = worker_options(
                    lease=p.lease,
                    max_in_flight=p.max_in_flight,
                    sleep_ms=p.sleep_ms,
                    seed=p.seed,
                    extra=slow,
                )
                await w.spawn(server.address, *opts)
            for w in workers:
                await w.wait_ready()
            pids = {w.name: w.pid for w in workers}
            began = time.monotonic()

            def processed() -> set[str]:
                for w in workers:
                    w.update()
                return set().union(*(w.done_ids for w in workers))

            def progress() -> tuple[int, int]:
                return len(ledger.acks), len(processed())

            def all_done() -> bool:
                return {acks[0].job_id for acks in ledger.acks.values()} <= processed()

            async def chaos_monkey(producers_done: trio.Event) -> None:
                deadline = trio.current_time() + p.timeout_s
                while trio.current_time() < deadline:
                    enqueued, done = progress()
                    finished = producers_done.is_set() and all_done()
                    if len(restarts) < p.restarts and (
                        finished or (enqueued + done) / (2 * p.jobs) >= points[len(restarts)]
                    ):
                        await trio.sleep(rng.uniform(0.0, 0.2))
                        await crash_and_restart(server)
                        continue
                    if finished and len(restarts) == p.restarts:
                        return
                    await trio.sleep(POLL_S)
                report.problems.append(f"timed out after {p.timeout_s}s")

            async def crash_and_restart(server: SeppServer) -> None:
                enqueued, done = progress()
                kill_at = time.time()
                await server.stop(kill=True)
                down = rng.uniform(*p.down_s)
                await trio.sleep(down)
                await server.start()
                restarts.append(Restart(kill_at, time.time(), down, enqueued, done))

            producers_done = trio.Event()

            async def produce() -> None:
                await producers.run(keys, give_up_after=p.timeout_s * 0.8)
                producers_done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                nursery.start_soon(chaos_monkey, producers_done)
            main_s = time.monotonic() - began

            # Probes: rounds of slow jobs, enough that every live worker must take some,
            # until each worker has done a job since the last restart. A worker that failed
            # many reserves in a row may sleep up to RESERVE_BACKOFF_CAP_S before its next.
            last_back = restarts[-1].back_at if restarts else 0.0

            def resumed() -> set[str]:
                return {w.name for w in workers if any(r.t > last_back for r in w.of_kind("D"))}

            window = trio.current_time() + PROBE_WINDOW_S
            probe_rounds = 0
            while len(resumed()) < len(workers) and trio.current_time() < window:
                first = probe_rounds * p.workers * p.max_in_flight * 2
                probe_keys = [
                    f"probe{first + i:05d}" for i in range(p.workers * p.max_in_flight * 2)
                ]
                probe_rounds += 1
                await producers.probes(probe_keys, give_up_after=60)
                ids = {ledger.job_id(k) for k in probe_keys}
                await poll_until(workers, lambda ids=ids: ids <= processed(), 60)

            report.check(
                {w.name: w.pid for w in workers} == pids and all(w.alive for w in workers),
                "a worker process was replaced or died",
            )
            shutdown_s = await stop_gracefully(report, workers)
            ready_left, dead_letters = await queue_leftovers(server.address)
            panics = [line for line in server.output_lines if "panicked" in line]
        finally:
            for w in workers:
                await w.reap()

    # -- what happened ---------------------------------------------------------------------
    done = done_by(workers)
    main_done = {
        job_id: runs for job_id, runs in done.items() if not runs[0][1].detail.startswith("probe")
    }
    acked_keys = {k for k in keys if ledger.acks.get(k)}
    acked_ids: dict[str, str] = {}
    for key in acked_keys:
        ids = {a.job_id for a in ledger.acks[key]}
        report.check(len(ids) == 1, f"key {key} was acked with different job ids {sorted(ids)}")
        acked_ids[key] = ledger.acks[key][0].job_id
    lost = sorted(k for k, job_id in acked_ids.items() if job_id not in main_done)
    failed_keys = set(keys) - acked_keys
    key_to_ids: dict[str, set[str]] = defaultdict(set)
    for job_id, runs in main_done.items():
        key_to_ids[runs[0][1].detail].add(job_id)
    split_keys = sorted(k for k, ids in key_to_ids.items() if len(ids) > 1)
    key_set = set(keys)
    phantoms = sorted(k for k in key_to_ids if k not in key_set)
    unacked_but_done = sorted(k for k in failed_keys if k in key_to_ids)
    duplicates = sum(1 for runs in main_done.values() if len(runs) > 1)
    extra_runs = sum(len(runs) - 1 for runs in main_done.values())
    # Why each duplicate ran again: what became of the ack of its first finished run.
    ack_outcome: dict[tuple[str, int], str] = {}
    for w in workers:
        for r in w.records:
            if r.kind == "A":
                ack_outcome[r.job_id, r.attempt] = "acked"
            elif r.kind == "AE":
                ack_outcome[r.job_id, r.attempt] = f"ack failed: {r.detail}"
    duplicate_causes = Counter(
        ack_outcome.get((job_id, min(r.attempt for _, r in runs)), "no ack")
        for job_id, runs in main_done.items()
        if len(runs) > 1
    )
    # An ack the client reported as done must stick: the job never comes back.
    last_attempt: dict[str, int] = {}
    for w in workers:
        for r in w.of_kind("R"):
            last_attempt[r.job_id] = max(r.attempt, last_attempt.get(r.job_id, 0))
    acked_then_back = sorted(
        job_id
        for (job_id, attempt), outcome in ack_outcome.items()
        if outcome == "acked" and last_attempt.get(job_id, 0) > attempt
    )
    last_back = restarts[-1].back_at if restarts else 0.0
    after_last = {
        w.name: sum(1 for r in w.of_kind("D") if r.t > last_back and r.detail.startswith("k"))
        for w in workers
    }
    probes_by = {
        w.name: sum(1 for r in w.of_kind("D") if r.detail.startswith("probe")) for w in workers
    }
    logs = check_logs(report, workers)
    redelivered = sum(1 for w in workers for r in w.of_kind("R") if r.attempt > 1)
    ack_failures = Counter(r.detail for w in workers for r in w.of_kind("AE"))
    extend_failures = Counter(r.detail for w in workers for r in w.of_kind("EE"))
    extends = sum(len(w.of_kind("E")) for w in workers)

    report.check(len(restarts) == p.restarts, f"only {len(restarts)} of {p.restarts} restarts")
    report.check(not lost, f"{len(lost)} acked job(s) never processed: {lost[:10]}")
    report.check(not split_keys, f"keys enqueued as more than one job: {split_keys[:10]}")
    report.check(not phantoms, f"processed jobs nobody enqueued: {phantoms[:10]}")
    report.check(not ledger.gave_up, f"{len(ledger.gave_up)} key(s) never got an ack")
    report.check(
        all(n > 0 for n in (after_last[w] + probes_by[w] for w in after_last)),
        f"a worker did no job after the last restart: {after_last} probes={probes_by}",
    )
    # Jobs first seen at attempt > 1: a reserve whose response the crash swallowed (the
    # server had leased them), so they came back when that lease expired.
    first_attempt: dict[str, int] = {}
    for w in workers:
        for r in w.of_kind("R"):
            first_attempt[r.job_id] = min(r.attempt, first_attempt.get(r.job_id, r.attempt))
    unseen_leases = sum(1 for a in first_attempt.values() if a > 1)
    gaps = resume_gaps(workers, restarts)
    report.check(
        not acked_then_back, f"{len(acked_then_back)} acked job(s) came back: {acked_then_back[:5]}"
    )
    report.check(not panics, f"the server panicked: {panics[:3]}")
    report.check(dead_letters == 0, f"{dead_letters} job(s) dead-lettered")
    report.check(ready_left == 0, f"{ready_left} job(s) left in the queue")
    report.check(producers.log.count("error") == 0, f"producer errors: {producers.log.records[:3]}")

    report.figures.update(
        jobs=p.jobs,
        restarts=len(restarts),
        lost=len(lost),
        duplicates=duplicates,
        extra_runs=extra_runs,
        acked_then_redelivered=len(acked_then_back),
        processed=len(main_done),
        enqueue_acked=len(acked_keys),
        enqueue_failed_keys=len(failed_keys),
        failed_attempts=sum(ledger.failed_attempts.values()),
        dedup_acks=sum(a.deduplicated for acks in ledger.acks.values() for a in acks),
        unacked_but_done=len(unacked_but_done),
        redelivered=redelivered,
        reserve_replies_lost=unseen_leases,
        max_resume_s=round(max((g for g in gaps.values() if g is not None), default=0.0), 2),
        lease_lost=sum(s.lease_lost for s in logs.values()),
        ack_failures=sum(ack_failures.values()),
        extends=extends,
        extend_failures=sum(extend_failures.values()),
        tracebacks=sum(s.tracebacks for s in logs.values()),
        duration_s=round(main_s, 1),
        shutdown_s=round(shutdown_s, 2),
        dead_letters=dead_letters,
        open_retries=len(producers.open_failures),
    )
    report.details = {
        "restarts": restarts,
        "after_last_restart": after_last,
        "probes_by_worker": probes_by,
        "probe_rounds": probe_rounds,
        "resume_s_after_last_restart": {
            name: None if g is None else round(g, 2)
            for (name, i), g in gaps.items()
            if i == len(restarts) - 1
        },
        "enqueue_errors": dict(ledger.errors),
        "ack_failures": dict(ack_failures),
        "duplicate_causes": dict(duplicate_causes),
        "extend_failures": dict(extend_failures),
        "by_mode": dict(ledger.by_mode),
        "worker_warnings": {n: s.warnings for n, s in logs.items()},
        "worker_recoveries": {n: s.recoveries for n, s in logs.items()},
        "producer_warnings": producers.log.count("warning"),
        "open_failures": producers.open_failures,
    }
    return report


def resume_gaps(
    workers: list[WorkerProc], restarts: list[Restart]
) -> dict[tuple[str, int], float | None]:
    """(worker, restart index) → seconds from the server being back to the worker's first
    reserve that returned jobs (None: none before the next crash, or the end)."""
    gaps: dict[tuple[str, int], float | None] = {}
    for w in workers:
        times = sorted(r.t for r in w.of_kind("R"))
        for i, restart in enumerate(restarts):
            end = restarts[i + 1].kill_at if i + 1 < len(restarts) else float("inf")
            at = bisect.bisect_right(times, restart.back_at)
            gaps[w.name, i] = (
                times[at] - restart.back_at if at < len(times) and times[at] < end else None
            )
    return gaps


def describe_restarts(restarts: list[Restart], jobs: int) -> str:
    return "; ".join(
        f"#{i + 1}: enqueued {r.enqueued}/{jobs} done {r.processed}, down {r.down_s:.2f}s"
        f" (back after {r.back_at - r.kill_at:.2f}s)"
        for i, r in enumerate(restarts)
    )


# -- scenario 2: a worker SIGKILLed mid-handler ------------------------------------------------


async def run_worker_kill(workdir: Path, seed: int, *, jobs: int = 4) -> Report:
    report = Report("worker SIGKILLed mid-handler", seed)
    rng = random.Random(seed)
    _make_dir(workdir)
    lease = 2.0
    victim = WorkerProc("victim", workdir)
    rescuer = WorkerProc("rescuer", workdir)
    cfg = server_config(max_lease_duration_ms=int(lease * 1000))
    async with sepp_server(cfg, data_dir=workdir / "data") as server:
        try:
            common = {"lease": lease, "max_in_flight": jobs, "sleep_ms": "1:5", "seed": seed}
            await victim.spawn(server.address, *worker_options(**common, extra=["--hang"]))
            await victim.wait_ready()
            async with sepp.open(server.address) as client:
                ids = [(await client.enqueue(_request(f"kill{i}"))).job_id for i in range(jobs)]
            started = await poll_until(
                [victim], lambda: set(ids) <= {r.job_id for r in victim.of_kind("S")}, 20
            )
            report.check(started, "the victim did not start every job")
            # The rescuer long-polls an empty queue while the victim holds every job.
            await rescuer.spawn(server.address, *worker_options(**common))
            await rescuer.wait_ready()
            await trio.sleep(rng.uniform(0.2, 1.5))  # the victim keeps extending meanwhile
            victim.send(signal.SIGKILL)
            killed_at = time.time()
            victim_status = await victim.wait_exit()
            rescued = await poll_until(
                [victim, rescuer],
                lambda: set(ids) <= {r.job_id for r in rescuer.of_kind("D")},
                lease + 20,
            )
            report.check(rescued, "the rescuer did not finish every job of the victim")
            await stop_gracefully(report, [rescuer])
        finally:
            await victim.reap()
            await rescuer.reap()
    check_logs(report, [victim, rescuer])
    first_seen = {}
    for r in rescuer.of_kind("R"):
        first_seen.setdefault(r.job_id, r)
    back_after = [first_seen[i].t - killed_at for i in ids if i in first_seen]
    report.check(victim_status == -signal.SIGKILL, f"victim exit status {victim_status}")
    report.check(not victim.of_kind("D"), "the victim finished a job it should hang on")
    report.check(
        all(first_seen[i].attempt >= 2 for i in ids if i in first_seen),
        "a rescued job came back without a new attempt",
    )
    # The victim extends its lease every third of it, so ~1.3 s remained (less under load).
    report.check(
        all(0.2 <= s <= lease + 8 for s in back_after),
        f"jobs came back {back_after}s after the kill (lease {lease}s)",
    )
    report.figures.update(
        jobs=jobs,
        lease_s=lease,
        victim_started=len({r.job_id for r in victim.of_kind("S")}),
        rescued=len(set(ids) & {r.job_id for r in rescuer.of_kind("D")}),
        back_after_s=f"{min(back_after, default=0):.2f}-{max(back_after, default=0):.2f}",
        attempts=sorted({first_seen[i].attempt for i in ids if i in first_seen}),
    )
    return report


# -- scenario 3: SIGTERM of a worker under load ------------------------------------------------


async def run_worker_sigterm(workdir: Path, seed: int, *, jobs: int = 400) -> Report:
    report = Report("worker SIGTERMed under load", seed)
    rng = random.Random(seed)
    _make_dir(workdir)
    leaver = WorkerProc("leaver", workdir)
    stayer = WorkerProc("stayer", workdir)
    both = [leaver, stayer]
    async with sepp_server(server_config(), data_dir=workdir / "data") as server:
        try:
            # The stayer takes a small share: in CI, with both at 8 in flight, a starved leaver
            # had done 40 jobs when the stayer had emptied the queue, and SIGTERM found it idle.
            for w, in_flight in ((leaver, 8), (stayer, 2)):
                opts = worker_options(
                    lease=10,
                    max_in_flight=in_flight,
                    sleep_ms="20:150",
                    seed=seed,
                    shutdown_timeout=10,
                )
                await w.spawn(server.address, *opts)
            for w in both:
                await w.wait_ready()
            async with sepp.open(server.address) as client:
                ids: list[str] = []
                for start in range(0, jobs, 100):
                    batch = [_request(f"t{i}") for i in range(start, min(start + 100, jobs))]
                    for result in await client.enqueue_batch(batch):
                        assert isinstance(result, sepp.EnqueueAck), result
                        ids.append(result.job_id)

            def unreserved() -> int:
                return len(set(ids) - {r.job_id for w in both for r in w.of_kind("R")})

            def busy() -> bool:
                # Work still queued, so the leaver is still taking jobs when the signal lands.
                finished = {r.job_id for r in leaver.of_kind("D")}
                running = {r.job_id for r in leaver.of_kind("S")} - finished
                return (
                    len(finished) >= jobs // 10 and len(running) > 0 and unreserved() >= jobs // 4
                )

            loaded = await poll_until(both, busy, 60)
            report.check(loaded, "the leaver never got busy")
            unreserved_at_busy = unreserved()
            await trio.sleep(rng.uniform(0.0, 0.1))
            leaver.send(signal.SIGTERM)
            termed_at = time.monotonic()
            status = await leaver.wait_exit()
            exit_s = time.monotonic() - termed_at
            report.check(status == 0, f"leaver exit status after SIGTERM: {status}")
            all_done = await poll_until(both, lambda: set(ids) <= set(done_by(both)), 60)
            report.check(all_done, "not every job was done")
            await stop_gracefully(report, [stayer])
        finally:
            for w in both:
                await w.reap()
    check_logs(report, both)
    (term,) = leaver.of_kind("T") or [Record("T", float("inf"), "-", 0, "-")]
    started = {r.job_id for r in leaver.of_kind("S")}
    in_flight_at_term = {r.job_id for r in leaver.of_kind("S") if r.t <= term.t} - {
        r.job_id for r in leaver.of_kind("D") if r.t <= term.t
    }
    reserved = {r.job_id for r in leaver.of_kind("R")}
    acked = {r.job_id for r in leaver.of_kind("A")}
    shutdown_nacks = {r.job_id for r in leaver.of_kind("N") if r.detail == "worker_shutdown"}
    seen_again = {r.job_id for w in both for r in w.of_kind("R") if r.attempt > 1}
    redeliveries = started & seen_again
    done = done_by(both)
    report.check(bool(in_flight_at_term), "no handler was running at SIGTERM: proved nothing")
    report.check(not redeliveries, f"{len(redeliveries)} job(s) it started were redelivered")
    report.check(started <= acked, f"{len(started - acked)} started job(s) were not acked")
    report.check(
        reserved <= acked | shutdown_nacks,
        f"{len(reserved - acked - shutdown_nacks)} reserved job(s) neither acked nor returned",
    )
    report.check(all(len(done.get(i, ())) == 1 for i in ids), "a job was done twice or never")
    report.figures.update(
        jobs=jobs,
        leaver_done=len(leaver.of_kind("D")),
        unreserved_at_busy=unreserved_at_busy,
        in_flight_at_sigterm=len(in_flight_at_term),
        finished_after_sigterm=len(
            {r.job_id for r in leaver.of_kind("D") if r.t > term.t} & in_flight_at_term
        ),
        returned_unstarted=len(shutdown_nacks - started),
        redeliveries=len(redeliveries),
        exit_status=status,
        exit_s=round(exit_s, 2),
    )
    return report
