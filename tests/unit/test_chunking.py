"""Big best-effort batches become several EnqueueBatch calls within the server's limits; an
atomic one over the limit is refused before sending. MockClock and a scripted channel."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from fixtures.scripted_channel import Call, ScriptedChannel, connected
from hypothesis import given
from hypothesis import strategies as st
from trio.testing import MockClock

import sepp
from sepp._client.chunking import MAX_CHUNK_BYTES, _total_bytes, estimated_bytes, split_batch
from sepp._model.convert import enqueue_batch_to_pb
from sepp.wire._status import StatusCode
from sepp.wire.drivers._trio import RpcError

R = sepp.EnqueueRequest


def keyed(count: int, **fields: Any) -> list[sepp.EnqueueRequest]:
    return [R("q", "t", idempotency_key=f"k{i}", **fields) for i in range(count)]


# -- splitting -------------------------------------------------------------------------------


def test_split_by_count_keeps_every_job_in_order() -> None:
    jobs = keyed(600)
    chunks = split_batch(jobs, max_jobs=256)
    assert [len(c) for c in chunks] == [256, 256, 88]
    assert [job for chunk in chunks for job in chunk] == jobs
    assert split_batch(jobs[:256], max_jobs=256) == [jobs[:256]]


def test_split_by_bytes_and_a_job_bigger_than_the_budget_goes_alone() -> None:
    mib = 1024 * 1024
    jobs = [R("q", "t", payload=sepp.Payload.bytes(b"x" * n * mib)) for n in (3, 3, 3, 10, 1)]
    chunks = split_batch(jobs, max_jobs=256, max_bytes=8 * mib)
    assert [[len(j.payload.data) // mib for j in c if j.payload] for c in chunks] == [
        [3, 3],
        [3],
        [10],
        [1],
    ]
    assert MAX_CHUNK_BYTES <= 8 * mib  # half the server's fixed 16 MiB message cap


texts = st.text(min_size=1, max_size=20)


@given(
    queue=texts.filter(lambda name: name == name.strip()),  # outer whitespace is refused
    job_type=texts,
    key=st.none() | texts,
    data=st.none() | st.binary(min_size=1, max_size=300),
    custom=st.dictionaries(
        texts, st.text(max_size=20) | st.integers(-(2**63), 2**63 - 1) | st.booleans()
    ),
    tracestate=st.none() | st.text(max_size=40),
)
def test_the_size_estimate_bounds_the_encoded_job(
    queue: str,
    job_type: str,
    key: str | None,
    data: bytes | None,
    custom: dict[str, str | int | bool],
    tracestate: str | None,
) -> None:
    trace = sepp.TraceContext("00-" + "1" * 32 + "-" + "2" * 16 + "-01", tracestate)
    payload = None if data is None else sepp.Payload.bytes(data, "application/x-" + job_type)
    request = R(
        queue, job_type, payload=payload, idempotency_key=key, custom=custom, trace_context=trace
    )
    assert len(enqueue_batch_to_pb([request], None)) <= estimated_bytes(request)


# -- enqueue_batch ---------------------------------------------------------------------------


async def test_a_big_batch_goes_out_in_ordered_chunks_a_few_at_a_time(
    autojump_clock: MockClock,
) -> None:
    channel = ScriptedChannel(max_enqueue_batch=10)

    async def later_chunks_answer_first(call: Call, jobs: list[Any]) -> None:
        await trio.sleep(10 - int(jobs[0].idempotency_key[1:]) / 10)

    channel.on_enqueue = later_chunks_answer_first
    async with connected(channel) as client:
        jobs = keyed(65)
        results = await client.enqueue_batch(jobs)
    assert [r.job_id for r in results if isinstance(r, sepp.EnqueueAck)] == [
        j.idempotency_key for j in jobs
    ]
    sent = [c for c in channel.calls if c.method == "EnqueueBatch"]
    assert [c.jobs for c in sent] == [10, 10, 10, 10, 10, 10, 5]
    assert channel.most_in_flight == 4  # bounded concurrency, not 7 at once


async def test_a_failed_chunk_is_raised_and_no_further_chunk_is_sent(
    autojump_clock: MockClock,
) -> None:
    channel = ScriptedChannel(max_enqueue_batch=10)

    async def second_chunk_fails(call: Call, jobs: list[Any]) -> None:
        if jobs[0].idempotency_key == "k10":
            raise RpcError(StatusCode.UNAVAILABLE, "chunk 2 lost")
        await trio.sleep(1)

    channel.on_enqueue = second_chunk_fails
    async with connected(channel) as client:
        with pytest.raises(sepp.TransportError, match="chunk 2 lost"):
            await client.enqueue_batch(keyed(100))
    sent = [c.jobs for c in channel.calls if c.method == "EnqueueBatch"]
    assert sent == [10, 10, 10, 10]  # the four first in flight; the other six never sent


async def test_local_rejections_and_chunks_merge_in_order(autojump_clock: MockClock) -> None:
    channel = ScriptedChannel(job_type_limit=8, max_enqueue_batch=3)
    async with connected(channel) as client:
        await trio.sleep(1)  # the limits have arrived
        jobs = keyed(7)
        jobs[2] = R("q", "t" * 9, idempotency_key="bad")
        results = await client.enqueue_batch(jobs)
    assert results[2] == sepp.JobTypeNameTooLong(8, 9)
    assert [r.job_id for r in results if isinstance(r, sepp.EnqueueAck)] == [
        "k0",
        "k1",
        "k3",
        "k4",
        "k5",
        "k6",
    ]
    assert [c.jobs for c in channel.calls if c.method == "EnqueueBatch"] == [3, 3]


async def test_without_known_limits_chunks_hold_the_servers_default_256(
    autojump_clock: MockClock,
) -> None:
    channel = ScriptedChannel()
    async with connected(channel, validate_locally=False) as client:
        results = await client.enqueue_batch(keyed(300))
    assert len(results) == 300
    assert [c.jobs for c in channel.calls] == [256, 44]


# -- enqueue_atomic --------------------------------------------------------------------------


async def test_an_atomic_batch_over_the_servers_max_is_refused_before_sending(
    autojump_clock: MockClock,
) -> None:
    channel = ScriptedChannel(max_enqueue_batch=10)
    async with connected(channel) as client:
        with pytest.raises(sepp.ValidationError, match="at most 10 jobs") as info:
            await client.enqueue_atomic(keyed(11))
    assert info.value.field == "jobs"
    assert "max_enqueue_batch" in str(info.value)
    assert channel.methods() == ["GetServerInfo"]


plain_or_not = st.builds(
    R,
    st.sampled_from(["q", "orders", "q" * 30]),
    st.sampled_from(["t", "send_email"]),
    payload=st.none()
    | st.builds(
        sepp.Payload.bytes, st.binary(min_size=1, max_size=600), st.sampled_from(["a/b", "ü"])
    ),
    idempotency_key=st.none() | texts,
    custom=st.just({}) | st.dictionaries(texts, st.integers(0, 9), max_size=2),
    trace_context=st.none() | st.just(sepp.TraceContext("00-" + "1" * 32 + "-" + "2" * 16 + "-01")),
)


@given(st.lists(plain_or_not, min_size=1, max_size=20), st.integers(1, 30), st.integers(0, 9000))
def test_a_batch_is_split_as_the_per_job_estimates_say(
    jobs: list[sepp.EnqueueRequest], max_jobs: int, max_bytes: int
) -> None:
    # The common batch is summed inline (a plain job with no call): the same total.
    assert _total_bytes(jobs) == sum(map(estimated_bytes, jobs))
    chunks = split_batch(jobs, max_jobs=max_jobs, max_bytes=max_bytes)
    assert [job for chunk in chunks for job in chunk] == jobs
    fits = len(jobs) <= max_jobs and sum(map(estimated_bytes, jobs)) <= max_bytes
    assert (len(chunks) == 1) == (fits or len(jobs) == 1)
