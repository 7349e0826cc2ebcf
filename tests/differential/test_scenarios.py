"""The issue's scenarios, each run against the real sepp server and the memory server at once:
every answer must be the same (tests/differential/both_servers.py says what "the same" allows)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import trio
from both_servers import Side, assert_same, batch, job, reserve, run_on_both, settle

from sepp._pb import queue_pb2 as pb

pytestmark = pytest.mark.differential

NIL_UUID = "00000000-0000-4000-8000-000000000000"


async def compare(scenario: Any, config: dict[str, Any] | None = None, **kw: Any) -> None:
    real, memory = await run_on_both(scenario, config, **kw)
    assert real.transcript, "the scenario recorded nothing"
    assert_same(real, memory)


def ack(side: Side, label: str, attempt: int = 1, **fields: Any) -> pb.AckRequest:
    return pb.AckRequest(job_id=side.job_id(label), attempt=attempt, **fields)


def nack(side: Side, label: str, attempt: int = 1, **fields: Any) -> pb.NackRequest:
    retry = fields.pop("retry", None)
    request = pb.NackRequest(job_id=side.job_id(label), attempt=attempt, **fields)
    if retry == "dead_letter":
        request.retry.dead_letter.SetInParent()
    elif retry == "default":
        request.retry.default.SetInParent()
    elif retry == "empty":
        request.retry.SetInParent()
    elif retry is not None:
        request.retry.delay.FromMilliseconds(round(retry * 1000))
    return request


def extend(side: Side, label: str, attempt: int, lease_s: float) -> pb.ExtendRequest:
    request = pb.ExtendRequest(job_id=side.job_id(label), attempt=attempt)
    request.lease_duration.FromMilliseconds(round(lease_s * 1000))
    return request


def drain(queue: str | None = None, most: int | None = None) -> pb.DrainDeadLettersRequest:
    request = pb.DrainDeadLettersRequest()
    if queue is not None:
        request.queue = queue
    if most is not None:
        request.max = most
    return request


RETAIN = {"storage": {"dead_letter_retention_ms": 600_000}}


async def test_server_info() -> None:
    async def scenario(side: Side) -> None:
        await side.call("GetServerInfo", pb.GetServerInfoRequest())

    await compare(scenario)
    await compare(
        scenario,
        {
            "server": {"strict_queues": True},
            "limits": {
                "allowed_encodings": ["application/json"],
                "max_payload_bytes": 1000,
                "max_lease_duration_ms": 7000,
                "max_wait_timeout_ms": 9000,
                "max_schedule_horizon_ms": 86_400_000,
                "max_reserve_batch": 7,
            },
            **RETAIN,
        },
    )


async def test_enqueue_reserve_ack_roundtrip_with_every_field() -> None:
    async def scenario(side: Side) -> None:
        await side.call(
            "EnqueueBatch",
            batch(
                job(
                    "q",
                    "send",
                    payload=(b"\x00\xff data", "application/x-bytes"),
                    priority=7,
                    max_attempts=5,
                    custom={"s": "x", "i": -3, "d": 1.5, "b": True},
                    traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                    idempotency_key="k1",
                )
            ),
        )
        answer = await side.call("Reserve", reserve("q", lease_s=20, max_jobs=3))
        await side.call("Ack", ack(side, "j0", 1, worker_id="w"))
        await side.call("Ack", ack(side, "j0", 1))  # already acked
        assert answer[0] == "Reserve"

    await compare(scenario)


async def test_priorities_then_enqueue_order() -> None:
    async def scenario(side: Side) -> None:
        for priority in (0, 5, 9, 5, 0, 9):
            await side.call("EnqueueBatch", batch(job("q", priority=priority)))
            await settle(side)
        await side.call("EnqueueBatch", batch(*(job("q", priority=3) for _ in range(4))))
        await side.call("Reserve", reserve("q", max_jobs=20))

    await compare(scenario)


async def test_reserve_fills_from_the_queues_in_listed_order() -> None:
    async def scenario(side: Side) -> None:
        for queue in ("a", "b", "c", "a", "b"):
            await side.call("EnqueueBatch", batch(job(queue)))
            await settle(side)
        await side.call("Reserve", reserve("c", "a", "b", max_jobs=4))
        await side.call("Reserve", reserve("b", "b", max_jobs=4))  # a queue named twice

    await compare(scenario)


async def test_reserve_clamps_max_jobs_lease_and_defaults_to_one_job() -> None:
    config = {
        "limits": {"max_reserve_batch": 3, "max_lease_duration_ms": 60_000},
        "queues": [{"name": "short", "max_lease_duration_ms": 2_000}],
    }

    async def scenario(side: Side) -> None:
        # Distinct priorities: jobs of one priority enqueued in the same millisecond are
        # taken in an order the real server draws from their random ids.
        await side.call("EnqueueBatch", batch(*(job("q", priority=p) for p in range(6))))
        await side.call("EnqueueBatch", batch(*(job("short", priority=p) for p in range(3))))
        await side.call("Reserve", reserve("q"))  # max_jobs unset: one
        await side.call("Reserve", reserve("q", max_jobs=100, lease_s=600))  # 3, 60 s
        await side.call("Reserve", reserve("q", "short", max_jobs=3, lease_s=30))  # 2 s
        await side.call("Reserve", reserve("short", lease_s=0.0004))  # floored to 1 ms

    await compare(scenario, config)


async def test_scheduled_delivery_and_its_horizon() -> None:
    config = {"limits": {"max_schedule_horizon_ms": 3_600_000}}
    now = datetime.now(timezone.utc)  # one for both sides: the servers echo what they got

    async def scenario(side: Side) -> None:
        await side.call(
            "EnqueueBatch",
            batch(
                job("q", "soon", scheduled_at=now + timedelta(seconds=0.6)),
                job("q", "past", scheduled_at=now - timedelta(days=3)),
                job("q", "later", scheduled_at=now + timedelta(minutes=50)),
                job("q", "too-far", scheduled_at=now + timedelta(minutes=70)),
                job("q", "way-too-far", scheduled_at=datetime(9000, 1, 1, tzinfo=timezone.utc)),
            ),
        )
        await side.call("Reserve", reserve("q", max_jobs=10))  # the past one only
        await side.call("Reserve", reserve("q", max_jobs=10, wait_s=3))  # wakes on promotion

    await compare(scenario, config)


async def test_lease_expiry_redelivers_then_dead_letters_on_the_last_attempt() -> None:
    async def scenario(side: Side) -> None:
        await side.call("EnqueueBatch", batch(job("q", max_attempts=2, payload=b"p")))
        await side.call("Reserve", reserve("q", lease_s=0.3))
        await trio.sleep(0.7)
        await side.call("Ack", ack(side, "j0", 1))  # lapsed: not found
        await side.call("Reserve", reserve("q", lease_s=0.3))  # attempt 2
        await side.call("Ack", ack(side, "j0", 1))  # a stale attempt
        await trio.sleep(0.7)
        await side.call("Reserve", reserve("q"))  # nothing: dead-lettered
        await side.call("DrainDeadLetters", drain("q", 5))

    await compare(scenario, RETAIN)


async def test_extend_moves_the_lease_and_is_clamped() -> None:
    config = {"limits": {"max_lease_duration_ms": 5_000}}

    async def scenario(side: Side) -> None:
        await side.call("EnqueueBatch", batch(job("q")))
        await side.call("Reserve", reserve("q", lease_s=0.4))
        await trio.sleep(0.2)
        await side.call("Extend", extend(side, "j0", 1, 1.0))
        await trio.sleep(0.5)
        await side.call("Reserve", reserve("q"))  # still leased: nothing
        await side.call("Extend", extend(side, "j0", 1, 60))  # clamped to 5 s
        await side.call("Extend", extend(side, "j0", 2, 1.0))  # attempt mismatch
        await side.call("Extend", extend(side, "j0", 1, 0.0004))  # floored to 1 ms
        await trio.sleep(0.3)
        await side.call("Extend", extend(side, "j0", 1, 1.0))  # lapsed: not found
        await side.call("Extend", pb.ExtendRequest(job_id=NIL_UUID, attempt=1))  # no lease

    await compare(scenario, config)


async def test_an_extend_of_an_attempt_no_job_has_probes_a_lease_and_changes_nothing() -> None:
    """What a result's beacon probe relies on (sepp._client.replies): FAILED_PRECONDITION
    while the job is leased, NOT_FOUND once it is not (lapsed, back in its queue; acked)."""
    never = 2**32 - 1

    async def scenario(side: Side) -> None:
        await side.call("EnqueueBatch", batch(job("q"), job("q")))
        await side.call("Reserve", reserve("q", lease_s=0.3, max_jobs=2))
        await side.call("Extend", extend(side, "j0", never, 0.001))  # leased: mismatch
        await side.call("Ack", ack(side, "j1", 1))
        await side.call("Extend", extend(side, "j1", never, 0.001))  # acked: not found
        await trio.sleep(1.6)  # j0's lease lapsed (and the real server swept it)
        await side.call("Extend", extend(side, "j0", never, 0.001))  # ready again: not found
        await side.call("Reserve", reserve("q"))  # the probe left it as it was: attempt 2

    await compare(scenario)


async def test_nack_immediate_delayed_and_to_the_dead_letters() -> None:
    async def scenario(side: Side) -> None:
        await side.call("EnqueueBatch", batch(job("q", "a"), job("q", "b"), job("q", "c")))
        await side.call("Reserve", reserve("q", max_jobs=3))
        await side.call("Nack", nack(side, "j0", 1, reason="again"))  # back at its place
        await side.call("Nack", nack(side, "j1", 1, retry=0.5, reason="later"))
        await side.call("Nack", nack(side, "j2", 1, retry="dead_letter", reason="bad"))
        await side.call("Nack", nack(side, "j2", 1))  # gone
        await side.call("Reserve", reserve("q", max_jobs=3))  # j0, attempt 2
        await trio.sleep(0.8)
        await side.call("Reserve", reserve("q", max_jobs=3))  # j1, attempt 2
        await side.call("Nack", nack(side, "j1", 2, retry="default"))
        await side.call("Nack", nack(side, "j0", 2, retry="empty"))  # no strategy: refused
        await side.call("DrainDeadLetters", drain("q", 5))

    await compare(scenario, RETAIN)


async def test_queue_retry_policy_delays_a_default_nack() -> None:
    config = {
        **RETAIN,
        "queues": [
            {
                "name": "policy",
                "retry_delay_ms": 400,
                "retry_backoff": "exponential",
                "retry_delay_max_ms": 1_000,
            }
        ],
    }

    async def scenario(side: Side) -> None:
        await side.call("EnqueueBatch", batch(job("policy", max_attempts=4)))
        await side.call("Reserve", reserve("policy"))
        await side.call("Nack", nack(side, "j0", 1))  # 300-400 ms
        await side.call("Reserve", reserve("policy"))  # not yet
        await trio.sleep(0.6)
        await side.call("Reserve", reserve("policy"))  # attempt 2
        await side.call("Nack", nack(side, "j0", 2, retry=0.0))  # an explicit 0: at once
        await side.call("Reserve", reserve("policy"))  # attempt 3

    await compare(scenario, config)


async def test_attempts_ceiling_and_exhaustion() -> None:
    config = {**RETAIN, "limits": {"max_attempts_ceiling": 2, "default_max_attempts": 1}}

    async def scenario(side: Side) -> None:
        await side.call("EnqueueBatch", batch(job("q", max_attempts=50), job("q")))
        await side.call("Reserve", reserve("q", max_jobs=2))
        await side.call("Nack", nack(side, "j0", 1))
        await side.call("Nack", nack(side, "j1", 1, reason="only one"))  # exhausted
        await settle(side)  # the next dead letter a millisecond later, on both servers
        await side.call("Reserve", reserve("q", max_jobs=2))
        await side.call("Nack", nack(side, "j0", 2))  # exhausted at the ceiling
        await side.call("DrainDeadLetters", drain(None, 10))

    await compare(scenario, config)


async def test_dead_letters_drain_oldest_first_by_queue_and_max() -> None:
    async def scenario(side: Side) -> None:
        for queue in ("x", "y", "x", "y", "x"):
            await side.call("EnqueueBatch", batch(job(queue)))
            await side.call("Reserve", reserve(queue))
            label = f"j{len(side.labels) - 1}"
            await side.call("Nack", nack(side, label, 1, retry="dead_letter"))
            await settle(side)
        await side.call("DrainDeadLetters", drain())  # max unset: one
        await side.call("DrainDeadLetters", drain("y", 10))
        await side.call("DrainDeadLetters", drain(None, 1000))  # clamped to max_reserve_batch
        await side.call("DrainDeadLetters", drain(None, 10))  # drained: nothing

    await compare(scenario, {**RETAIN, "limits": {"max_reserve_batch": 2}})


async def test_without_retention_dead_letters_are_dropped() -> None:
    async def scenario(side: Side) -> None:
        await side.call("EnqueueBatch", batch(job("q", max_attempts=1)))
        await side.call("Reserve", reserve("q"))
        await side.call("Nack", nack(side, "j0", 1))
        await side.call("DrainDeadLetters", drain("q", 5))
        await side.call("GetServerInfo", pb.GetServerInfoRequest())

    await compare(scenario)


async def test_dead_letters_expire_after_their_retention() -> None:
    async def scenario(side: Side) -> None:
        await side.call("EnqueueBatch", batch(job("q"), job("q")))
        await side.call("Reserve", reserve("q", max_jobs=2))
        await side.call("Nack", nack(side, "j0", 1, retry="dead_letter"))
        await trio.sleep(0.7)
        await side.call("Nack", nack(side, "j1", 1, retry="dead_letter"))
        await side.call("DrainDeadLetters", drain("q", 5))  # j1 only: j0 expired

    await compare(scenario, {"storage": {"dead_letter_retention_ms": 500}})


async def test_idempotency_keys_within_and_after_their_window() -> None:
    config = {
        "storage": {"dedup_window_ms": 500},
        "queues": [{"name": "long", "dedup_window_ms": 60_000}],
    }

    async def scenario(side: Side) -> None:
        first = job("q", idempotency_key="k", payload=b"first")
        again = job("q", idempotency_key="k", payload=b"second")
        await side.call("EnqueueBatch", batch(first, again, job("other", idempotency_key="k")))
        await side.call("EnqueueBatch", batch(job("long", idempotency_key="k")))
        await side.call("Reserve", reserve("q", max_jobs=5))
        await side.call("Ack", ack(side, "j0"))
        await side.call("EnqueueBatch", batch(again))  # completed, still deduplicated
        await trio.sleep(0.7)
        await side.call("EnqueueBatch", batch(again, job("long", idempotency_key="k")))

    await compare(scenario, config)


async def test_depth_limits_and_dedup_hits_that_bypass_them() -> None:
    config = {
        "queues": [{"name": "cap", "max_queue_depth": 2}, {"name": "none", "max_queue_depth": 0}]
    }

    async def scenario(side: Side) -> None:
        await side.call(
            "EnqueueBatch",
            batch(
                job("cap", idempotency_key="a", priority=2),
                job("cap", priority=1),
                job("cap"),
                job("none"),
            ),
        )
        await side.call("EnqueueBatch", batch(job("cap", idempotency_key="a")))  # a hit
        await side.call("Reserve", reserve("cap"))
        await side.call("EnqueueBatch", batch(job("cap")))  # in flight still counts
        await side.call("Ack", ack(side, "j0"))
        await side.call("EnqueueBatch", batch(job("cap"), job("cap")))

    await compare(scenario, config)


async def test_payload_encoding_custom_and_name_limits() -> None:
    config = {
        "limits": {
            "max_payload_bytes": 8,
            "allowed_encodings": ["a", "b"],
            "max_custom_entries": 3,
            "max_custom_total_bytes": 30,
            "max_custom_key_bytes": 4,
            "max_queue_name_bytes": 6,
            "max_job_type_bytes": 5,
            "max_idempotency_key_bytes": 4,
        },
        "queues": [{"name": "big", "max_payload_bytes": 20, "allowed_encodings": ["c"]}],
    }

    async def scenario(side: Side) -> None:
        await side.call(
            "EnqueueBatch",
            batch(
                job("q", payload=(b"123456789", "a")),
                job("q", payload=(b"12345678", "a")),
                job("q", payload=(b"1", "json")),
                job("big", payload=(b"x" * 20, "c")),
                job("big", payload=(b"x" * 21, "c")),
                job("big", payload=(b"x", "a")),
                job("q", custom={"a": 1, "b": 2, "c": 3, "d": 4}),
                job("q", custom={"abcde": 1, "zzzzzz": 2}),
                job("q", custom={"s": "x" * 30}),
                job("q", custom={"é": "x" * 26}),
                job("queue7"),
                job("q", "type56"),
                job("q", idempotency_key="12345"),
                job("qé", "é", idempotency_key="é"),
            ),
        )

    await compare(scenario, config)


async def test_structurally_invalid_jobs_are_invalid_request_rejections() -> None:
    async def scenario(side: Side) -> None:
        await side.call(
            "EnqueueBatch",
            batch(
                job(""),
                job("."),
                job(".."),
                job("a/b"),
                job("tab\there"),
                job("q", ""),
                job("q", payload=(b"", "x")),
                job("q", payload=(b"x", "")),
                job("q", idempotency_key=""),
                job("q", priority=10),
                job("q", max_attempts=0),
                job("q", traceparent=""),
                job("q", custom={"": 1}),
                job("q", custom={"k": None}),
                job("q", priority=9, max_attempts=1, idempotency_key="fine"),
            ),
        )

    await compare(scenario)


async def test_allowed_job_types_and_strict_queues() -> None:
    config = {
        "server": {"strict_queues": True},
        "queues": [{"name": "jobs", "allowed_job_types": ["send", "boom"]}, {"name": "free"}],
    }

    async def scenario(side: Side) -> None:
        await side.call(
            "EnqueueBatch",
            batch(job("jobs", "send"), job("jobs", "other"), job("free", "any"), job("nope")),
        )
        await side.call("EnqueueAtomic", batch(job("jobs", "send"), job("undeclared")))
        await side.call("Reserve", reserve("jobs", "free", max_jobs=5))
        await side.call("Reserve", reserve("free", "ghost", "ghost", 'q"ú\u0301'))

    await compare(scenario, config)


async def test_atomic_batches_commit_all_or_nothing() -> None:
    config = {"queues": [{"name": "cap", "max_queue_depth": 2}]}

    async def scenario(side: Side) -> None:
        await side.call("EnqueueAtomic", batch(job("q"), job("q", priority=11), job("q", "")))
        await side.call("Reserve", reserve("q", max_jobs=5))  # nothing was committed
        await side.call("EnqueueAtomic", batch(job("q", idempotency_key="k"), job("cap")))
        await side.call(
            "EnqueueAtomic", batch(job("cap"), job("q"), job("cap", idempotency_key="d"))
        )  # 3 for a cap of 2 (a dedup key counts as new): every cap job reported
        await side.call("EnqueueAtomic", batch(job("cap", idempotency_key="d")))
        await side.call("EnqueueAtomic", batch(job("cap", idempotency_key="d")))  # hit, at cap
        await side.call("EnqueueAtomic", batch(job("q", idempotency_key="k"), job("q")))
        await side.call("Reserve", reserve("q", "cap", max_jobs=10))

    await compare(scenario, config)


async def test_batch_sizes_are_checked() -> None:
    async def scenario(side: Side) -> None:
        await side.call("EnqueueBatch", batch())
        await side.call("EnqueueAtomic", batch())
        await side.call("EnqueueBatch", batch(*(job("q") for _ in range(4))))
        await side.call("EnqueueAtomic", batch(*(job("q") for _ in range(4))))

    await compare(scenario, {"limits": {"max_enqueue_batch": 3}})


async def test_reserve_validation_and_its_messages() -> None:
    config = {"limits": {"max_reserve_queues": 2, "max_queue_name_bytes": 8}}

    async def scenario(side: Side) -> None:
        await side.call("Reserve", reserve())
        await side.call("Reserve", reserve("a", "", "b"))
        await side.call("Reserve", reserve("a/b"))
        await side.call("Reserve", reserve("a", lease_s=None))
        await side.call("Reserve", reserve("a", lease_s=0))
        await side.call("Reserve", reserve("a", lease_s=-1))
        await side.call("Reserve", reserve("a", wait_s=-1))
        await side.call("Reserve", reserve("a", worker_id=""))
        await side.call("Reserve", reserve("a", max_jobs=0))
        await side.call("Reserve", reserve("a", "b", "c"))
        await side.call("Reserve", reserve("a", "long-name\\é"))
        await side.call("Reserve", reserve('"quote"9'))

    await compare(scenario, config)


async def test_lease_calls_validation_and_statuses() -> None:
    async def scenario(side: Side) -> None:
        for method, request in (
            ("Ack", pb.AckRequest(job_id="not-a-uuid", attempt=1)),
            ("Ack", pb.AckRequest(job_id=NIL_UUID, attempt=0)),
            ("Ack", pb.AckRequest(job_id=NIL_UUID.upper(), attempt=1)),
            ("Ack", pb.AckRequest(job_id=NIL_UUID, attempt=1, worker_id="")),
            ("Nack", pb.NackRequest(job_id="x" * 36, attempt=1)),
            ("Nack", pb.NackRequest(job_id=NIL_UUID, attempt=1)),
            ("Extend", pb.ExtendRequest(job_id=NIL_UUID, attempt=1)),
            ("DrainDeadLetters", drain("", 1)),
            ("DrainDeadLetters", drain("q", 0)),
        ):
            await side.call(method, request)
        bad_delay = nack(side, NIL_UUID, 1, retry=-1.0)
        await side.call("Nack", bad_delay)

    await compare(scenario)


async def test_a_waiting_reserve_wakes_on_enqueue() -> None:
    async def scenario(side: Side) -> None:
        woken: list[object] = []
        async with trio.open_nursery() as nursery:

            async def wait() -> None:
                woken.append(await side.call("Reserve", reserve("q", wait_s=10), record=False))

            nursery.start_soon(wait)
            await trio.sleep(0.3)
            await side.call("EnqueueBatch", batch(job("q", "wake")))
        side.note(("woken", woken))
        await side.call("Reserve", reserve("q", wait_s=0.2))  # waits out its time: empty

    await compare(scenario)


async def test_api_keys() -> None:
    config = {"auth": {"api_keys": [{"name": "suite", "key": "suite-secret-0001"}]}}

    async def scenario(side: Side) -> None:
        await side.call("GetServerInfo", pb.GetServerInfoRequest())

    for key in (None, "wrong-key", "suite-secret-0001"):
        await compare(scenario, config, api_key=key)
    await compare(scenario, {"auth": {"api_keys": []}}, api_key="anything")


async def test_unknown_methods_are_unimplemented() -> None:
    async def scenario(side: Side) -> None:
        try:
            await side.client._channel.call("Nope", b"", timeout=10)
        except Exception as exc:
            side.note((type(exc).__name__, int(exc.code), exc.details))  # type: ignore[attr-defined]

    await compare(scenario)
