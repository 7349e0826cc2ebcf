"""Hypothesis-made sequences of enqueues (single, batched, atomic), reserves, acks, nacks,
extends and drains, with random keys, priorities, payload sizes, custom maps, schedules and
bad input, played against the real server and the memory server: every answer must be the
same.

Both servers are started once for the module (each from a thread of its own) with small
limits, so that random input runs into them; every example uses queues of its own. What
depends on time elapsing is left to test_scenarios.py: leases and nack delays here are long
enough never to run out during an example, and each call waits out a millisecond after the
last, so that no two enqueues share one (the real server orders such ties by its random ids;
tests/differential/both_servers.py says what else is normalized)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import trio
from both_servers import (
    Side,
    assert_same,
    run_on_addresses,
    servers_in_threads,
    set_custom,
    settle,
)
from fixtures.fuzz import examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sepp._pb import queue_pb2 as pb

pytestmark = pytest.mark.differential

CONFIG: dict[str, Any] = {
    "limits": {
        "max_payload_bytes": 48,
        "max_custom_entries": 3,
        "max_custom_total_bytes": 40,
        "max_custom_key_bytes": 6,
        "max_queue_name_bytes": 24,
        "max_job_type_bytes": 8,
        "max_idempotency_key_bytes": 8,
        "max_enqueue_batch": 6,
        "max_reserve_batch": 4,
        "max_reserve_queues": 3,
        "max_queue_depth": 3,
        "default_max_attempts": 2,
        "max_attempts_ceiling": 4,
        "max_lease_duration_ms": 60_000,
        "retry_delay_ms": 60_000,
        "retry_delay_max_ms": 600_000,
        "retry_backoff": "exponential",
        "max_schedule_horizon_ms": 30 * 86_400_000,
    },
    "storage": {"dead_letter_retention_ms": 600_000, "dedup_window_ms": 600_000},
}
NIL_UUID = "00000000-0000-4000-8000-000000000000"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_PREFIXES = itertools.count()


@pytest.fixture(scope="module")
def addresses() -> Iterator[tuple[str, str]]:
    with servers_in_threads(CONFIG) as both:
        yield both


# -- the operations ---------------------------------------------------------------------

QUEUES = ("u1", "u2", "u3")  # an example's own queues (prefixed with its number)
BAD_QUEUES = ("", ".", "a/b", "ctl\x07", "x" * 30, "é" * 12)


@dataclass(frozen=True)
class JobSpec:
    queue: str  # one of QUEUES (prefixed) or a bad name as it is
    job_type: str
    payload: tuple[bytes, str] | None
    priority: int | None
    idempotency_key: str | None
    max_attempts: int | None
    custom: tuple[tuple[str, Any], ...]
    schedule: str | None  # "past", "hour", "too-far"
    traceparent: str | None


@dataclass(frozen=True)
class Enqueue:
    jobs: tuple[JobSpec, ...]
    atomic: bool


@dataclass(frozen=True)
class Reserve:
    queues: tuple[str, ...]
    max_jobs: int | None
    lease_s: float


@dataclass(frozen=True)
class Settle:
    """Ack, nack or extend a job this side reserved (the `pick`-th, modulo), or a job that
    does not exist (`missing`), with its attempt moved by `attempt_delta`."""

    call: str  # "ack", "nack", "extend"
    pick: int
    missing: bool
    attempt_delta: int
    strategy: str | None  # nack: None, "default", "delay0", "delay60", "dead_letter", "empty"
    reason: str | None
    lease_s: float


@dataclass(frozen=True)
class Drain:
    queue: str | None
    most: int | None


@dataclass(frozen=True)
class Info:
    pass


def mostly(valid: list[Any], invalid: list[Any]) -> st.SearchStrategy[Any]:
    """One of `valid` about 9 times in 10: a job with one bad field is refused whole, so
    each field must be good most of the time for jobs to get in at all."""
    return st.sampled_from(valid * (9 * max(1, len(invalid))) + invalid * len(valid))


values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=12),
    st.booleans(),
    st.floats(allow_nan=False),
    st.integers(-1000, 1000),
    st.text(max_size=3),
    st.booleans(),
    st.none(),  # an entry with no value
)
job_specs = st.builds(
    JobSpec,
    queue=mostly(["u1", "u1", "u2", "u3"], list(BAD_QUEUES)),
    job_type=mostly(["a", "b"], ["", "too-long-type"]),
    payload=st.one_of(
        st.none(),
        st.tuples(
            mostly([b"{}", b"x" * 40, b"\x00\xff"], [b"", b"y" * 49]) | st.binary(max_size=60),
            mostly(["application/json", "x"], [""]),
        ),
    ),
    priority=mostly([None, *range(10)], [10]),
    idempotency_key=mostly([None, None, "k1", "k2", "k3"], ["", "too-long-key"]),
    max_attempts=mostly([None, 1, 2, 3, 5, 6], [0]),
    custom=st.lists(
        st.tuples(mostly(["a", "bb", "ccc"], ["", "long-key"]), values), max_size=2
    ).map(tuple)
    | st.lists(st.tuples(st.sampled_from(["a", "bb", "ccc", "dddd"]), values), max_size=5).map(
        tuple
    ),
    schedule=mostly([None, None, None, "past", "hour"], ["too-far"]),
    traceparent=mostly([None, None, TRACEPARENT], [""]),
)
good_job_specs = st.builds(
    JobSpec,
    queue=st.sampled_from(["u1", "u1", "u2", "u3"]),
    job_type=st.sampled_from(["a", "b"]),
    payload=st.none() | st.tuples(st.binary(min_size=1, max_size=48), st.just("x")),
    priority=st.none() | st.integers(0, 9),
    idempotency_key=st.sampled_from([None, None, "k1", "k2"]),
    max_attempts=st.sampled_from([None, 1, 2, 3, 6]),
    custom=st.lists(st.tuples(st.sampled_from(["a", "bb"]), st.integers(-5, 5)), max_size=2).map(
        tuple
    ),
    schedule=st.sampled_from([None, None, None, "past", "hour"]),
    traceparent=st.sampled_from([None, TRACEPARENT]),
)
good_enqueues = st.builds(
    Enqueue, jobs=st.lists(good_job_specs, min_size=1, max_size=4).map(tuple), atomic=st.booleans()
)
good_reserves = st.builds(
    Reserve,
    queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True).map(tuple),
    max_jobs=st.sampled_from([None, 1, 2, 4]),
    lease_s=st.just(30.0),
)
good_settles = st.builds(
    Settle,
    call=st.sampled_from(["ack", "nack", "nack", "extend"]),
    pick=st.integers(0, 20),
    missing=st.just(False),
    attempt_delta=st.just(0),
    strategy=st.sampled_from([None, "default", "delay0", "delay0", "delay60", "dead_letter"]),
    reason=st.sampled_from([None, "why"]),
    lease_s=st.sampled_from([10.0, 120.0]),
)
enqueues = st.builds(
    Enqueue,
    jobs=st.lists(job_specs, min_size=1, max_size=6).map(tuple)
    | st.lists(job_specs, max_size=7).map(tuple),  # empty, or over max_enqueue_batch
    atomic=st.booleans(),
)
reserves = st.builds(
    Reserve,
    queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3).map(tuple)
    | st.lists(st.sampled_from([*QUEUES, "", "a/b"]), max_size=4).map(tuple),
    max_jobs=mostly([None, 1, 2, 3, 4, 6], [0]),
    lease_s=mostly([30.0, 120.0], [0.0]),
)
settles = st.builds(
    Settle,
    call=st.sampled_from(["ack", "nack", "nack", "extend"]),
    pick=st.integers(0, 20),
    missing=mostly([False], [True]),
    attempt_delta=mostly([0], [1, -1]),
    strategy=st.sampled_from([None, "default", "delay0", "delay60", "dead_letter", "empty"]),
    reason=st.sampled_from([None, "", "why"]),
    lease_s=mostly([10.0, 120.0], [0.0]),
)
drains = st.builds(
    Drain,
    queue=st.one_of(st.none(), st.sampled_from(QUEUES), st.just("")),
    most=st.one_of(st.none(), st.integers(0, 6), st.just(300)),
)
# Mostly calls that do something (so that later calls meet jobs), some that probe the checks.
operations = st.one_of(
    good_enqueues,
    good_reserves,
    good_settles,
    good_enqueues,
    good_reserves,
    good_settles,
    enqueues,
    reserves,
    settles,
    drains,
    st.just(Info()),
)


def _queue(prefix: str, name: str) -> str:
    return f"{prefix}-{name}" if name in QUEUES else name


def _unique_priorities(jobs: tuple[JobSpec, ...]) -> list[int | None]:
    """The jobs' priorities, changed where two for one queue would be equal (after the
    default, 0): such ties in one batch are ordered by the real server's random ids."""
    taken: dict[str, set[int]] = {}
    out: list[int | None] = []
    for spec in jobs:
        used = taken.setdefault(spec.queue, set())
        priority = spec.priority
        effective = 0 if priority is None else priority
        if effective <= 9 and effective in used:
            effective = next(p for p in range(10) if p not in used)
            priority = effective
        if effective <= 9:
            used.add(effective)
        out.append(priority)
    return out


def _request(spec: JobSpec, priority: int | None, prefix: str, now: datetime) -> Any:
    request = pb.EnqueueRequest(queue=_queue(prefix, spec.queue), job_type=spec.job_type)
    if spec.payload is not None:
        request.payload.data, request.payload.encoding = spec.payload
    if priority is not None:
        request.priority = priority
    if spec.idempotency_key is not None:
        request.idempotency_key = spec.idempotency_key
    if spec.max_attempts is not None:
        request.max_attempts = spec.max_attempts
    for key, value in spec.custom:
        set_custom(request, key, value)
    if spec.schedule is not None:
        at = {
            "past": now - timedelta(days=2),
            "hour": now + timedelta(hours=1),
            "too-far": now + timedelta(days=40),
        }[spec.schedule]
        request.scheduled_at.FromDatetime(at)
    if spec.traceparent is not None:
        request.trace_context.traceparent = spec.traceparent
    return request


async def drain_everything(side: Side) -> None:
    """Take whatever dead letters earlier examples left (unrecorded), so that a drain of no
    queue in particular sees this example's alone, on both servers alike."""
    request = pb.DrainDeadLettersRequest(max=CONFIG["limits"]["max_reserve_batch"])
    while True:
        answer = await side.call("DrainDeadLetters", request, record=False)
        if answer[0] != "DrainDeadLetters" or not answer[1]["records"]:
            return


async def play(side: Side, ops: list[Any], prefix: str, now: datetime) -> None:
    held: list[tuple[str, int]] = []  # (job id, attempt) of the jobs this side holds
    settled: list[tuple[str, int]] = []  # and of those it acked or nacked
    await drain_everything(side)
    for op in ops:
        if isinstance(op, Enqueue):
            priorities = _unique_priorities(op.jobs)
            batch = pb.EnqueueBatchRequest(
                jobs=[
                    _request(spec, p, prefix, now)
                    for spec, p in zip(op.jobs, priorities, strict=True)
                ]
            )
            await side.call("EnqueueAtomic" if op.atomic else "EnqueueBatch", batch)
        elif isinstance(op, Reserve):
            request = pb.ReserveRequest(queues=[_queue(prefix, q) for q in op.queues])
            request.lease_duration.FromMilliseconds(round(op.lease_s * 1000))
            if op.max_jobs is not None:
                request.max_jobs = op.max_jobs
            answer = await side.call("Reserve", request)
            if answer[0] == "Reserve":
                for job in answer[1]["jobs"]:
                    held.append((side.job_id(job["id"]), int(job["attempt"])))
        elif isinstance(op, Settle):
            if not op.missing and held:
                job_id, attempt = held[op.pick % len(held)]
            elif op.missing and settled and op.pick % 2:
                job_id, attempt = settled[op.pick % len(settled)]  # acked or nacked already
            else:
                job_id, attempt = NIL_UUID, 1
            picked = (job_id, attempt)
            attempt = max(attempt + op.attempt_delta, 0)
            if op.call == "ack":
                answer = await side.call("Ack", pb.AckRequest(job_id=job_id, attempt=attempt))
            elif op.call == "extend":
                extend = pb.ExtendRequest(job_id=job_id, attempt=attempt)
                extend.lease_duration.FromMilliseconds(round(op.lease_s * 1000))
                answer = await side.call("Extend", extend)
            else:
                nack = pb.NackRequest(job_id=job_id, attempt=attempt)
                if op.reason is not None:
                    nack.reason = op.reason
                if op.strategy == "default":
                    nack.retry.default.SetInParent()
                elif op.strategy == "dead_letter":
                    nack.retry.dead_letter.SetInParent()
                elif op.strategy == "empty":
                    nack.retry.SetInParent()
                elif op.strategy is not None:
                    nack.retry.delay.FromMilliseconds(0 if op.strategy == "delay0" else 60_000)
                answer = await side.call("Nack", nack)
            if answer[0] in ("Ack", "Nack") and picked in held:
                held.remove(picked)
                settled.append(picked)
        elif isinstance(op, Drain):
            request = pb.DrainDeadLettersRequest()
            if op.queue is not None:
                request.queue = _queue(prefix, op.queue)
            if op.most is not None:
                request.max = op.most
            await side.call("DrainDeadLetters", request)
        else:
            await side.call("GetServerInfo", pb.GetServerInfoRequest())
        await settle(side)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    ops=st.tuples(good_enqueues, st.lists(operations, min_size=10, max_size=50)).map(
        lambda first_and_rest: [first_and_rest[0], *first_and_rest[1]]
    )
)
def test_random_sequences_answer_alike(addresses: tuple[str, str], ops: list[Any]) -> None:
    prefix = f"e{next(_PREFIXES)}"
    now = datetime.now(timezone.utc).replace(microsecond=0)

    async def scenario(side: Side) -> None:
        await play(side, ops, prefix, now)

    real, memory = trio.run(run_on_addresses, scenario, *addresses)
    for answer in memory.transcript:  # what the examples reached (--hypothesis-show-statistics)
        text = repr(answer)
        for what in (
            "queue_full",
            "'success'",
            "invalid_request",
            "deduplicated",
            "'jobs': [{",
            "'records': [{",
            "'dead_lettered': True",
        ):
            if what in text:
                event(f"an answer with {what}")
        if answer[0] == "error":
            event(f"status {answer[1]}")
    assert_same(real, memory)
