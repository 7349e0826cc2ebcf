"""Jobs that lead to jobs, without a server: the custom entries and keys that carry chains,
follow-ups and results (`_model/pipelines`), `ctx.then`, tasks with results, chains and
groups as built, and what the Worker enqueues before an ack (against the scripted FakeClient on
trio's MockClock). The real server's side is tests/integration/test_pipelines_real.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import trio
from fixtures.fake_client import FakeClient, RecordingLogger
from fixtures.fuzz import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

import sepp
from sepp._client import replies as replies_module
from sepp._client.replies import Replies
from sepp._model import pipelines as p
from sepp._runtime.trio_runtime import TRIO
from sepp._util.log import Log
from sepp.testing import follow_ups, job_context, sync_job_context

pytestmark = pytest.mark.unit
GUARD_S = 30


@dataclasses.dataclass(frozen=True)
class Image:
    name: str


@dataclasses.dataclass(frozen=True)
class Thumb:
    name: str
    px: int


resize = sepp.Task("images", "resize", Image, result=Thumb)
upload = sepp.Task("uploads", "upload", Thumb, result=str, priority=7, custom={"team": "media"})
notify = sepp.Task("notes", "notify", str)


# -- the entries ---------------------------------------------------------------------------------

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
queue_names = names.filter(lambda n: not n[0].isspace() and not n[-1].isspace())
steps = st.builds(
    p.StepSpec,
    queue_names,
    names,
    st.none() | st.integers(0, 9),
    st.none() | st.integers(1, 100),
    st.dictionaries(names, st.integers(-(2**63), 2**63 - 1) | names | st.booleans(), max_size=3),
)


@settings(max_examples=examples(200))
@given(st.text(min_size=1, max_size=40), st.integers(1, 50), st.lists(steps, max_size=5))
def test_a_chain_position_reads_back_as_it_was_written(
    chain_id: str, step: int, rest: list[p.StepSpec]
) -> None:
    position = p.ChainPosition(chain_id, step, step + len(rest), tuple(rest))
    custom = {"mine": 1, **position.entries()}
    assert p.chain_position(custom) == position
    if rest:
        assert p.chain_position(position.advanced().entries()) == p.ChainPosition(
            chain_id, step + 1, step + len(rest), tuple(rest[1:])
        )
    else:
        assert p.CHAIN_NEXT not in custom  # the last step: nothing after it


custom_values = st.integers(-5, 5) | st.text(max_size=30) | st.booleans() | st.floats()


@settings(max_examples=examples(300))
@given(
    st.dictionaries(
        st.sampled_from([p.CHAIN_ID, p.CHAIN_STEP, p.CHAIN_STEPS, p.CHAIN_NEXT, "other"]),
        custom_values
        | st.lists(
            st.dictionaries(st.sampled_from(["queue", "job_type", "priority"]), custom_values)
        ).map(json.dumps),
    )
)
def test_any_custom_map_reads_as_a_chain_position_or_is_refused_as_not_one(
    custom: dict[str, Any],
) -> None:
    try:
        position = p.chain_position(custom)
    except sepp.ValidationError:
        return
    assert (position is None) == (p.CHAIN_ID not in custom)


def test_the_keys_derived_from_a_job_id_fit_the_server_and_never_meet() -> None:
    job_id = "0b7ad4d4-6c5b-4b9c-9f4e-2a7e3f3a2f10"
    keys = [p.follow_up_key(job_id, i) for i in range(1000)]
    keys += [p.chain_next_key(job_id), p.result_key(job_id)]
    assert len(set(keys)) == len(keys)
    assert max(len(k.encode()) for k in keys) <= 256  # the server's max_idempotency_key_bytes
    assert p.follow_up_key(job_id, 0) != p.follow_up_key(job_id.replace("0b", "1b"), 0)


def test_a_reply_address_reads_back_and_a_foreign_one_reads_as_none() -> None:
    address = p.ReplyAddress("sepp.replies.abc", "r1", "beacon-id", 1_800_000_000_000)
    assert p.reply_address({"x": 1, **address.entries()}) == address
    assert p.reply_address({}) is None
    assert p.reply_address({**address.entries(), p.REPLY_UNTIL: "soon"}) is None
    assert address.expired(datetime(2030, 1, 1, tzinfo=timezone.utc))
    assert not address.expired(datetime(2020, 1, 1, tzinfo=timezone.utc))


def test_a_failure_reply_carries_the_chain_and_step_and_reads_back() -> None:
    address = p.ReplyAddress("sepp.replies.abc", "r1", "b", 1)
    failure = p.Failure("job-1", "images", "upload", "x" * 5000, "chain-9", 2, 3)
    request = p.reply_request(address, "job-1", sepp.Payload.json(1), failure)
    assert request.payload is None  # a failure has no value
    assert request.idempotency_key == p.result_key("job-1")
    read = p.read_failure(request.custom)
    assert read == dataclasses.replace(failure, reason="x" * p.MAX_REPLY_REASON_CHARS)
    ok = p.reply_request(address, "job-1", sepp.Payload.json(1), None)
    assert ok.custom[p.RESULT_STATUS] == p.OK and ok.payload == sepp.Payload.json(1)


# -- ctx.then ------------------------------------------------------------------------------------


def test_then_records_requests_task_jobs_chains_and_groups_in_order() -> None:
    ctx = job_context("order")
    assert follow_ups(ctx) == []
    plain = sepp.EnqueueRequest("audit", "log", idempotency_key="mine")
    ctx.then(plain, notify.job("hi"))
    ctx.then(sepp.chain(resize.job(Image("a")), upload))
    ctx.then(sepp.group(notify.job("x"), notify.job("y")))
    recorded = follow_ups(ctx)
    assert [(r.queue, r.job_type) for r in recorded] == [
        ("audit", "log"),
        ("notes", "notify"),
        ("images", "resize"),
        ("notes", "notify"),
        ("notes", "notify"),
    ]
    assert recorded[0] is plain
    chain = p.chain_position(recorded[2].custom)
    assert chain is not None and (chain.step, chain.steps) == (1, 2)
    assert chain.rest == (p.StepSpec("uploads", "upload", 7, None, {"team": "media"}),)


def test_then_refuses_anything_but_jobs_at_once() -> None:
    ctx = job_context("order")
    with pytest.raises(TypeError, match=r"ctx.then\(\) takes"):
        ctx.then(notify)  # type: ignore[arg-type]  # a task, not a job of it
    with pytest.raises(sepp.ValidationError):
        ctx.then(notify.job(42))  # type: ignore[arg-type]  # not the task's payload type
    assert follow_ups(ctx) == []


def test_a_def_handlers_context_records_into_the_same_job() -> None:
    ctx = job_context("order")
    sync_job_context(ctx).then(notify.job("from a thread"))
    assert [r.payload for r in follow_ups(ctx)] == [sepp.Payload.json("from a thread")]


# -- tasks with results, chains and groups ----------------------------------------------------


def test_a_task_with_a_result_type_encodes_and_decodes_it_and_refuses_another() -> None:
    payload = resize.encode_result(Thumb("a", 64))
    assert payload == sepp.Payload.json({"name": "a", "px": 64})
    assert resize.decode_result(payload) == Thumb("a", 64)
    with pytest.raises(sepp.ValidationError, match="returns Thumb, got str"):
        resize.encode_result("a thumbnail")  # type: ignore[arg-type]
    with pytest.raises(sepp.PayloadDecodeError):
        resize.decode_result(None)  # a result that never had a value
    assert notify.encode_result(None) is None and notify.decode_result(None) is None
    assert "Image -> Thumb" in repr(resize)


def test_a_task_subscripted_with_its_payload_type_alone_means_any_result() -> None:
    assert sepp.Task[Image] == sepp.Task[Image, Any]
    assert sepp.Task[Image, Thumb].__args__ == (Image, Thumb)  # type: ignore[attr-defined]


def test_each_enqueue_of_a_chain_is_a_chain_of_its_own() -> None:
    chain = sepp.chain(resize.job(Image("a"), priority=3), upload, notify)
    (first,) = chain._enqueue_requests()
    (again,) = chain._enqueue_requests()
    one, two = p.chain_position(first.custom), p.chain_position(again.custom)
    assert one is not None and two is not None and one.chain_id != two.chain_id
    assert (one.step, one.steps, len(one.rest)) == (1, 3, 2)
    assert first.priority == 3 and first.job_type == "resize"
    assert chain.tasks == (resize, upload, notify) and chain.last is notify
    assert repr(chain) == "<sepp.Chain resize -> upload -> notify>"


def test_a_chain_refuses_what_it_cannot_run() -> None:
    with pytest.raises(sepp.ValidationError, match="at least two steps"):
        sepp.chain(resize.job(Image("a")))  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="first step is a job"):
        sepp.chain(resize, upload)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="a chord"):
        sepp.chain(resize.job(Image("a")), sepp.group(upload.job(Thumb("b", 1))))  # type: ignore[call-overload]
    with pytest.raises(sepp.ValidationError, match="members"):
        sepp.group()
    with pytest.raises(TypeError, match="member 1"):
        sepp.group(notify.job("a"), notify)  # type: ignore[call-overload]


# -- the Worker: follow-ups before the ack -----------------------------------------------------


class PipelineFake(FakeClient):
    """The FakeClient with the enqueue calls follow-ups and results make, each recorded with
    the (mock) time it was made at; `enqueue_errors` are raised one per call."""

    def __init__(self) -> None:
        super().__init__()
        self.enqueued: list[tuple[float, list[sepp.EnqueueRequest]]] = []
        self.enqueue_errors: list[BaseException] = []

    def add_job(self, request: sepp.EnqueueRequest, max_attempts: int = 5) -> str:
        job_id = self.add(
            request.job_type, request.payload, queue=request.queue, max_attempts=max_attempts
        )
        self._jobs[job_id].custom = dict(request.custom)
        return job_id

    async def enqueue_atomic(
        self, jobs: Sequence[sepp.EnqueueRequest], *, timeout: float | timedelta | None = None
    ) -> list[sepp.EnqueueAck]:
        await trio.lowlevel.checkpoint()
        if self.enqueue_errors:
            raise self.enqueue_errors.pop(0)
        self.enqueued.append((trio.current_time(), list(jobs)))
        return [sepp.EnqueueAck(f"id-{i}") for i, _ in enumerate(jobs)]

    async def enqueue(self, request: sepp.EnqueueRequest, /, **_: Any) -> sepp.EnqueueAck:
        (ack,) = await self.enqueue_atomic([request])
        return ack

    def sent(self) -> list[sepp.EnqueueRequest]:
        return [request for _, batch in self.enqueued for request in batch]


def make_worker(fake: FakeClient, **options: Any) -> sepp.Worker:
    return sepp.Worker(
        fake, ["q", "images"], _wall_clock=fake.now, logger=RecordingLogger(), **options
    )


@asynccontextmanager
async def running(worker: sepp.Worker) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        yield
        worker.shutdown()


async def run_until_settled(worker: sepp.Worker, fake: FakeClient) -> None:
    """Run `worker` until it has acked or nacked a job: on the real clock, for `def` handlers
    (threads); the guard bounds a hang only."""
    settled = trio.Event()

    async def on_settle(ctx: sepp.JobContext) -> None:
        settled.set()

    fake.on_ack = fake.on_nack = on_settle
    with trio.fail_after(GUARD_S):
        async with running(worker):
            await settled.wait()


async def test_follow_ups_go_in_one_atomic_enqueue_under_keys_of_the_job_before_its_ack(
    autojump_clock: MockClock,
) -> None:
    fake = PipelineFake()
    worker = make_worker(fake)

    @worker.handler("order")
    async def order(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ctx.then(notify.job("shipped"), sepp.EnqueueRequest("audit", "log", idempotency_key="k"))
        ctx.then(notify.job("invoiced"))

    enqueued_before_the_ack: list[int] = []

    async def on_ack(ctx: sepp.JobContext) -> None:
        enqueued_before_the_ack.append(len(fake.enqueued))

    fake.on_ack = on_ack
    job_id = fake.add("order")
    async with running(worker):
        await trio.sleep(1)
    assert enqueued_before_the_ack == [1]
    ((enqueued_at, batch),) = fake.enqueued
    assert [r.idempotency_key for r in batch] == [
        p.follow_up_key(job_id, 0),
        "k",  # a key of the request's own is kept
        p.follow_up_key(job_id, 2),
    ]
    assert [r.payload for r in batch] == [
        sepp.Payload.json("shipped"),
        None,
        sepp.Payload.json("invoiced"),
    ]
    (ack,) = fake.acks
    assert ack.job_id == job_id and ack.at >= enqueued_at


async def test_a_def_handler_asks_for_follow_ups_from_its_thread() -> None:
    fake = PipelineFake()
    worker = make_worker(fake)

    @worker.handler("order")
    def order(payload: sepp.Payload | None, ctx: sepp.SyncJobContext) -> None:
        ctx.then(notify.job("from a thread"))

    job_id = fake.add("order")
    await run_until_settled(worker, fake)
    assert [(r.job_type, r.idempotency_key) for r in fake.sent()] == [
        ("notify", p.follow_up_key(job_id, 0))
    ]
    assert len(fake.acks) == 1


async def test_a_failed_handler_enqueues_none_of_its_follow_ups(autojump_clock: MockClock) -> None:
    fake = PipelineFake()
    worker = make_worker(fake)

    @worker.handler("order")
    async def order(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ctx.then(notify.job("never"))
        raise RuntimeError("the order failed")

    fake.add("order", max_attempts=1)
    async with running(worker):
        await trio.sleep(1)
    assert fake.enqueued == [] and fake.acks == []
    (nack,) = fake.nacks
    assert nack.reason == "handler raised RuntimeError: the order failed"


async def test_follow_ups_that_cannot_be_sent_leave_the_job_unacked_for_a_retry(
    autojump_clock: MockClock,
) -> None:
    fake = PipelineFake()
    fake.enqueue_errors = [
        sepp.TransportError("UNAVAILABLE: gone", code=sepp.StatusCode.UNAVAILABLE)
    ]
    worker = make_worker(fake, backoff=sepp.Backoff(initial=1, jitter=0))
    runs = []

    @worker.handler("order")
    async def order(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        runs.append(ctx.attempt)
        ctx.then(notify.job("shipped"))

    job_id = fake.add("order")
    async with running(worker):
        await trio.sleep(5)
    assert runs == [1, 2]  # nacked for a retry after the backoff, then run again
    (nack,) = fake.nacks
    assert nack.retry == sepp.Retry.after(1) and "could not be enqueued" in (nack.reason or "")
    # The retry sends the same follow-up under the same key: at most one reaches the queue.
    assert [r.idempotency_key for r in fake.sent()] == [p.follow_up_key(job_id, 0)]
    assert [a.attempt for a in fake.acks] == [2]


@pytest.mark.parametrize(
    ("rejection", "retried"),
    [
        (sepp.QueueFull(queue="notes", limit=1), True),
        (sepp.JobTypeNotAllowed(job_type="notify", allowed=("other",)), False),
    ],
)
async def test_a_refused_follow_up_retries_the_job_only_if_a_retry_can_pass(
    autojump_clock: MockClock, rejection: sepp.JobRejection, retried: bool
) -> None:
    fake = PipelineFake()
    fake.enqueue_errors = [sepp.BatchValidationError([sepp.BatchRejection(0, rejection)])]
    worker = make_worker(fake, backoff=sepp.Backoff(initial=1, jitter=0))

    @worker.handler("order")
    async def order(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ctx.then(notify.job("shipped"))

    fake.add("order")
    async with running(worker):
        await trio.sleep(5)
    nack = fake.nacks[0]
    assert "#0 (notify on notes)" in (nack.reason or "")
    if retried:
        assert nack.retry == sepp.Retry.after(1) and len(fake.acks) == 1
    else:
        assert nack.retry == sepp.Retry.DEAD_LETTER and fake.acks == []


async def test_a_chain_step_enqueues_the_next_with_its_result_and_the_chain_moved_on(
    autojump_clock: MockClock,
) -> None:
    fake = PipelineFake()
    worker = make_worker(fake)

    @worker.task(resize)
    async def do_resize(image: Image, ctx: sepp.JobContext) -> Thumb:
        ctx.then(notify.job(f"resized {image.name}"))
        return Thumb(image.name, 64)

    (first,) = sepp.chain(resize.job(Image("cat")), upload, notify)._enqueue_requests()
    job_id = fake.add_job(first)
    async with running(worker):
        await trio.sleep(1)
    ((_, (note, step)),) = fake.enqueued  # the follow-up and the next step: one atomic enqueue
    assert note.job_type == "notify" and note.idempotency_key == p.follow_up_key(job_id, 0)
    assert (step.queue, step.job_type, step.priority) == ("uploads", "upload", 7)
    assert step.payload == sepp.Payload.json({"name": "cat", "px": 64})
    assert step.idempotency_key == p.chain_next_key(job_id)
    assert step.custom["team"] == "media"  # the task's own custom defaults
    moved = p.chain_position(step.custom)
    before = p.chain_position(first.custom)
    assert moved is not None and before is not None
    assert (moved.chain_id, moved.step, moved.steps) == (before.chain_id, 2, 3)
    assert moved.rest == (p.StepSpec("notes", "notify"),)
    assert len(fake.acks) == 1


async def test_a_result_of_the_wrong_type_fails_the_step_for_good(
    autojump_clock: MockClock,
) -> None:
    fake = PipelineFake()
    worker = make_worker(fake)

    @worker.task(resize)
    async def do_resize(image: Image, ctx: sepp.JobContext) -> Thumb:
        return "not a thumb"  # type: ignore[return-value]

    (first,) = sepp.chain(resize.job(Image("cat")), upload)._enqueue_requests()
    fake.add_job(first)
    async with running(worker):
        await trio.sleep(1)
    assert fake.enqueued == []
    (nack,) = fake.nacks
    assert nack.retry == sepp.Retry.DEAD_LETTER
    assert "result cannot be sent" in (nack.reason or "") and "returns Thumb, got str" in (
        nack.reason or ""
    )


async def test_a_job_that_asks_for_nothing_makes_no_call_but_its_ack(
    autojump_clock: MockClock,
) -> None:
    fake = PipelineFake()
    worker = make_worker(fake)

    @worker.handler("plain")
    async def plain(payload: sepp.Payload | None, ctx: sepp.JobContext) -> str:
        return "a value nobody asked for"

    job_id = fake.add("plain")
    fake._jobs[job_id].custom = {"mine": "not ours"}
    async with running(worker):
        await trio.sleep(1)
    assert fake.enqueued == [] and fake.nacks == [] and [a.job_id for a in fake.acks] == [job_id]


# -- the reply listener's checks ------------------------------------------------------------------


class DirectoryFake:
    """What the reply listener's check calls: a queue of replies per name, beacons alive or
    not, enqueues recorded."""

    def __init__(self, alive: set[str]) -> None:
        self.alive = alive
        self.queues: dict[str, list[sepp.Job]] = {}
        self.enqueued: list[sepp.EnqueueRequest] = []
        self.acked: list[str] = []

    async def enqueue(self, request: sepp.EnqueueRequest, /) -> sepp.EnqueueAck:
        self.enqueued.append(request)
        return sepp.EnqueueAck(f"id-{len(self.enqueued)}")

    async def reserve(self, queues: Sequence[str] | str, **_: Any) -> list[sepp.Job] | None:
        name = queues if isinstance(queues, str) else queues[0]
        jobs, self.queues[name] = self.queues.get(name, [])[:256], self.queues.get(name, [])[256:]
        return jobs or None

    async def ack(self, ctx: sepp.JobContext, **_: Any) -> None:
        self.acked.append(ctx.id)

    async def extend(self, ctx: sepp.JobContext, lease_duration: float | timedelta) -> datetime:
        if ctx.id in self.alive:
            raise sepp.AttemptMismatchError("FAILED_PRECONDITION: attempt mismatch")
        raise sepp.JobNotFoundError("NOT_FOUND: job not found")


def entry_job(queue: str, beacon: str, *, final: bool = False, generation: int = 0) -> sepp.Job:
    body = {"queue": queue, "beacon": beacon, "final": final, "generation": generation}
    ctx = job_context(replies_module.ENTRY_TYPE, queue=replies_module.DIRECTORY)
    return sepp.Job(sepp.Payload.json(body), ctx)


def reply_job(queue: str) -> sepp.Job:
    return sepp.Job(None, job_context(p.RESULT_JOB_TYPE, queue=queue, custom={p.REPLY_ID: "r"}))


@pytest.mark.parametrize(
    ("alive", "final", "cleared", "put_back"),
    [
        (True, False, 0, "not final"),  # its client lives: checked again later
        (False, False, 3, "final"),  # gone: cleared, and checked once more for late replies
        (False, True, 3, None),  # gone, checked once more: cleared and dropped
    ],
)
async def test_a_directory_entry_keeps_a_live_clients_queue_and_clears_a_gone_ones(
    alive: bool, final: bool, cleared: int, put_back: str | None
) -> None:
    calls = DirectoryFake({"beacon"} if alive else set())
    calls.queues["sepp.replies.other"] = [reply_job("sepp.replies.other") for _ in range(3)]
    replies = Replies(sepp._runtime.trio_runtime.TRIO, Log(RecordingLogger()))
    entry = entry_job("sepp.replies.other", "beacon", final=final, generation=4)
    await replies._take(calls, entry)
    assert len(calls.queues["sepp.replies.other"]) == 3 - cleared
    assert calls.acked.count(entry.ctx.id) == 1  # the entry itself is done either way
    assert len(calls.acked) == 1 + cleared
    if put_back is None:
        assert calls.enqueued == []
    else:
        (again,) = calls.enqueued
        assert again.queue == replies_module.DIRECTORY and again.scheduled_at is not None
        body = again.payload.json() if again.payload is not None else None
        assert body == {
            "queue": "sepp.replies.other",
            "beacon": "beacon",
            "final": put_back == "final",
            "generation": 5,
        }


async def test_the_listener_retries_failed_calls_on_the_one_backoff(
    autojump_clock: MockClock,
) -> None:
    """A reserve that fails is tried again after 1 s, doubling up to 10 s (`backoff_delay`)."""
    replies = Replies(TRIO, Log(RecordingLogger()))
    tried: list[float] = []

    class Failing(DirectoryFake):
        async def reserve(self, queues: Sequence[str] | str, **_: Any) -> list[sepp.Job] | None:
            tried.append(trio.current_time())
            if len(tried) == 7:
                replies.stop()  # the client closes under the call: the listener ends
            raise sepp.ClientError("UNAVAILABLE: the server went away")

    await replies.run(Failing(set()))
    assert [round(b - a, 6) for a, b in itertools.pairwise(tried)] == [1, 2, 4, 8, 10, 10]
    assert replies.closed is None  # its calls' failures end no wait


async def test_a_reply_nobody_waits_for_is_acked_and_dropped() -> None:
    calls = DirectoryFake(set())
    replies = Replies(sepp._runtime.trio_runtime.TRIO, Log(RecordingLogger()))
    waiting = replies.expect(60)
    gone = replies.expect(60)
    replies.forget(gone)
    for waiter in (waiting, gone):
        custom = {p.REPLY_ID: waiter.reply_id, p.RESULT_STATUS: p.OK}
        job = sepp.Job(
            sepp.Payload.json(1), job_context(p.RESULT_JOB_TYPE, queue=replies.queue, custom=custom)
        )
        await replies._take(calls, job)
    assert len(calls.acked) == 2
    assert isinstance(waiting.outcome, replies_module.Reply) and gone.outcome is None
    assert len(replies._waiters) == 0  # the client holds no result for a forgotten handle


async def test_a_result_passes_through_the_handlers_middleware(autojump_clock: MockClock) -> None:
    fake = PipelineFake()
    seen: list[str] = []

    async def outer(job: sepp.Job, call_next: sepp.CallNext) -> None:
        seen.append("outer")
        await call_next()

    worker = make_worker(fake, middleware=[outer])

    async def inner(job: sepp.Job, call_next: sepp.CallNext) -> None:
        seen.append("inner")
        await call_next()

    @worker.task(resize, middleware=[inner])
    async def do_resize(image: Image, ctx: sepp.JobContext) -> Thumb:
        return Thumb(image.name, 32)

    (first,) = sepp.chain(resize.job(Image("owl")), upload)._enqueue_requests()
    fake.add_job(first)
    async with running(worker):
        await trio.sleep(1)
    assert seen == ["outer", "inner"]
    (step,) = fake.sent()
    assert step.payload == sepp.Payload.json({"name": "owl", "px": 32})


async def test_a_def_handlers_client_refuses_to_wait_for_results() -> None:
    fake = PipelineFake()
    worker = make_worker(fake)
    raised: list[BaseException] = []

    @worker.handler("order")
    def order(payload: sepp.Payload | None, ctx: sepp.SyncJobContext) -> None:
        try:
            resize.submit(ctx.client, Image("a"))
        except sepp.ClientError as exc:
            raised.append(exc)
            raise

    fake.add("order")
    await run_until_settled(worker, fake)
    (error,) = raised
    assert "does not await results" in str(error) and "sepp.chain" in str(error)
    assert fake.enqueued == []  # refused before anything was sent
