"""Every client call and option against the real sepp server."""

from __future__ import annotations

import dataclasses
import functools
import random
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import trio
import trio.testing
from fixtures.counting import count_calls

import sepp
from sepp._client.operations import Call
from sepp.testing import SeppServer, sepp_server

pytestmark = [pytest.mark.both_engines, pytest.mark.asyncio_too, pytest.mark.arch_smoke]

HANG_GUARD_S = 30.0  # ends a call that should have ended already; never part of an assertion
BASE = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}


def config(**sections: object) -> dict[str, object]:
    out: dict[str, object] = {k: dict(v) for k, v in BASE.items()}
    for name, values in sections.items():
        old = out.get(name)
        if isinstance(old, dict) and isinstance(values, dict):
            out[name] = {**old, **values}
        else:
            out[name] = values
    return out


async def reserve_one(client: sepp.Client, queue: str, **kw: object) -> sepp.Job:
    jobs = await client.reserve([queue], wait_timeout=kw.pop("wait_timeout", 2), **kw)  # type: ignore[arg-type]
    assert jobs is not None and len(jobs) == 1
    return jobs[0]


async def test_get_server_info_maps_every_field(client: sepp.Client) -> None:
    info = await client.get_server_info()
    assert info.server_version == "0.1.1"
    assert "v1" in info.supported_protocol_versions
    assert abs(info.server_time - datetime.now(timezone.utc)) < timedelta(seconds=30)
    assert info.max_payload_bytes == 1_048_576
    assert info.max_enqueue_batch == 256 and info.max_reserve_batch == 256
    assert info.max_reserve_queues == 32
    assert info.max_schedule_horizon == timedelta(days=30)
    assert info.max_lease_duration == timedelta(minutes=5)
    assert info.max_wait_timeout == timedelta(minutes=5)
    assert info.max_custom_entries == 64 and info.max_custom_total_bytes == 16384
    assert info.max_custom_key_bytes == 256 and info.max_queue_name_bytes == 512
    assert info.max_job_type_bytes == 256 and info.max_idempotency_key_bytes == 256
    assert info.restricts_encodings is False and info.allowed_encodings == ()
    assert info.strict_queues is False and info.dead_letter_retention_enabled is True
    assert len(dataclasses.fields(info)) == 20


async def test_round_trip_keeps_payload_bytes_and_custom_types(client: sepp.Client) -> None:
    data = b"\x00\xff\xfe binary \x00 with NUL and invalid utf-8 \xc3\x28"
    custom = {"s": "x", "i": 1, "d": 1.5, "b": True, "big": 2**62, "neg": -(2**63), "one": 1.0}
    ack = await client.enqueue(
        "rt",
        "kind",
        payload=sepp.Payload.bytes(data, "application/x-test"),
        custom=custom,
        priority=7,
        max_attempts=5,
    )
    assert ack.deduplicated is False and uuid.UUID(ack.job_id)
    job = await reserve_one(client, "rt", lease_duration=30)
    assert job.id == ack.job_id
    assert job.payload == sepp.Payload(data, "application/x-test")
    assert job.ctx.custom == custom
    assert {k: type(v) for k, v in job.ctx.custom.items()} == {
        k: type(v) for k, v in custom.items()
    }
    assert (job.ctx.priority, job.ctx.max_attempts, job.ctx.attempt) == (7, 5, 1)
    assert job.ctx.queue == "rt" and job.ctx.job_type == "kind"
    assert job.ctx.enqueued_at.tzinfo is not None
    remaining = job.ctx.lease_expires_at - datetime.now(timezone.utc)
    assert timedelta(seconds=20) < remaining <= timedelta(seconds=31)
    await client.ack(job.ctx)


async def test_json_and_text_payload_helpers_round_trip(client: sepp.Client) -> None:
    await client.enqueue("p", "j", payload=sepp.Payload.json({"user": 42, "név": "ü"}))
    await client.enqueue(sepp.EnqueueRequest("p", "t", payload=sepp.Payload.text("héllo")))
    jobs = await client.reserve("p", max_jobs=2, wait_timeout=2)
    assert jobs is not None and len(jobs) == 2
    # Jobs enqueued within the same millisecond may come back in either order.
    by_type = {job.ctx.job_type: job.payload for job in jobs}
    assert by_type["j"] is not None and by_type["j"].json() == {"user": 42, "név": "ü"}
    assert by_type["t"] is not None and by_type["t"].text() == "héllo"


async def test_job_without_payload_has_none(client: sepp.Client) -> None:
    await client.enqueue("np", "t")
    job = await reserve_one(client, "np")
    assert job.payload is None


async def test_idempotent_enqueue_returns_same_id_deduplicated(client: sepp.Client) -> None:
    first = await client.enqueue("idem", "t", idempotency_key="order-1")
    second = await client.enqueue("idem", "t", idempotency_key="order-1")
    assert second.job_id == first.job_id
    assert (first.deduplicated, second.deduplicated) == (False, True)


async def test_reserve_returns_highest_priority_first(client: sepp.Client) -> None:
    for p in (0, 9, 5, 9):
        await client.enqueue("prio", f"p{p}", priority=p)
    jobs = await client.reserve("prio", max_jobs=4, wait_timeout=1)
    assert jobs is not None
    assert [j.ctx.priority for j in jobs] == [9, 9, 5, 0]


async def test_scheduled_job_is_delivered_only_when_due(client: sepp.Client) -> None:
    due = datetime.now(timezone.utc) + timedelta(seconds=1.5)
    await client.enqueue("sched", "t", scheduled_at=due)
    assert await client.reserve("sched", wait_timeout=0) is None
    job = await reserve_one(client, "sched", wait_timeout=6)
    assert datetime.now(timezone.utc) >= due - timedelta(milliseconds=50)
    assert job.ctx.scheduled_at is not None
    assert abs(job.ctx.scheduled_at - due) < timedelta(milliseconds=2)


async def test_empty_long_poll_returns_none_after_wait(client: sepp.Client) -> None:
    start = trio.current_time()
    assert await client.reserve("empty", wait_timeout=0.5) is None
    assert trio.current_time() - start >= 0.4


async def reserve_parked_on_server(client: sepp.Client) -> None:
    """Return once a reserve started by another task is waiting on the server: that task is
    blocked on its response, so its request was written, and a later call on the same
    connection has made a round trip, so the server has read the request before it."""
    await trio.testing.wait_all_tasks_blocked()
    await client.get_server_info()


async def test_enqueue_wakes_a_waiting_reserve(client: sepp.Client) -> None:
    got: list[sepp.Job] | None = None
    calls = count_calls(client)

    async def consumer() -> None:
        nonlocal got
        got = await client.reserve("wake", wait_timeout=10)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await reserve_parked_on_server(client)
            # The reserve is out, and waiting (the client may also have read the server's
            # limits in the background).
            assert calls.count("Reserve") == 1 and calls[-1] == "GetServerInfo"
            ack = await client.enqueue("wake", "t")
    # Woken by the enqueue: a reserve left waiting would have ended empty (None) at its
    # wait_timeout, and only this one reserve was ever sent.
    assert got is not None and [job.id for job in got] == [ack.job_id]
    assert calls.count("Reserve") == 1 and calls[-1] == "EnqueueBatch"


LIMITED = config(
    limits={
        "max_schedule_horizon_ms": 60_000,
        "max_custom_entries": 2,
        "max_custom_total_bytes": 40,
        "max_custom_key_bytes": 8,
        "max_queue_name_bytes": 16,
        "max_job_type_bytes": 8,
        "max_idempotency_key_bytes": 8,
    },
    queues=[
        {
            "name": "limited",
            "allowed_job_types": ["ok", "x"],
            "allowed_encodings": ["application/json"],
            "max_payload_bytes": 16,
            "max_queue_depth": 1,
        },
        {"name": "open"},
    ],
)
STRICT = config(server={"strict_queues": True}, queues=[{"name": "declared"}])


async def test_strict_mode_rejects_undeclared_queues() -> None:
    async with sepp_server(STRICT) as server, sepp.open(server.address) as client:
        results = await client.enqueue_batch(
            [sepp.EnqueueRequest("nope", "t"), sepp.EnqueueRequest("declared", "t")]
        )
        assert results[0] == sepp.UnknownQueue("nope")
        assert isinstance(results[1], sepp.EnqueueAck)
        with pytest.raises(sepp.UnknownQueuesError) as info:
            await client.reserve(["declared", "undeclared"], wait_timeout=0)
        assert info.value.code is sepp.StatusCode.FAILED_PRECONDITION
        assert (await client.reserve("declared", wait_timeout=1)) is not None


async def test_every_configurable_rejection_kind() -> None:
    async with sepp_server(LIMITED) as server, sepp.open(server.address) as client:
        R = sepp.EnqueueRequest
        js = sepp.Payload.json
        cases: list[tuple[sepp.EnqueueRequest, type[sepp.JobRejection]]] = [
            (R("open", "ok", payload=sepp.Payload.bytes(b"x" * 1_100_000)), sepp.PayloadTooLarge),
            (R("limited", "ok", payload=sepp.Payload.text("hi")), sepp.EncodingNotAllowed),
            (R("limited", "bad"), sepp.JobTypeNotAllowed),
            (R("open", "ok", custom={"a": 1, "b": 2, "c": 3}), sepp.CustomEntriesTooMany),
            (R("open", "ok", custom={"a": "y" * 50}), sepp.CustomMapTooLarge),
            (R("open", "ok", custom={"k" * 9: 1}), sepp.CustomKeyTooLong),
            (R("a" * 17, "ok"), sepp.QueueNameTooLong),
            (R("open", "t" * 9), sepp.JobTypeNameTooLong),
            (R("open", "ok", idempotency_key="k" * 9), sepp.IdempotencyKeyTooLong),
            (
                R("open", "ok", scheduled_at=datetime.now(timezone.utc) + timedelta(hours=1)),
                sepp.ScheduledTooFar,
            ),
        ]
        results = await client.enqueue_batch([req for req, _ in cases])
        assert [type(r).__name__ for r in results] == [k.__name__ for _, k in cases], results
        assert all(sepp.is_job_rejection(r) for r in results)
        too_large = results[0]
        assert isinstance(too_large, sepp.PayloadTooLarge) and too_large.limit == 1_048_576
        enc = results[1]
        assert isinstance(enc, sepp.EncodingNotAllowed) and enc.allowed == ("application/json",)
        far = results[9]
        assert isinstance(far, sepp.ScheduledTooFar) and far.horizon == timedelta(minutes=1)
        assert far.actual is not None
        for r in results:
            assert isinstance(r, sepp.JobRejection)
            assert sepp.describe_job_rejection(r)
        # Per-queue payload limit, then a full queue (depth 1).
        small = await client.enqueue_batch([R("limited", "ok", payload=js("y" * 40))])
        assert isinstance(small[0], sepp.PayloadTooLarge) and small[0].limit == 16
        await client.enqueue("limited", "ok")
        with pytest.raises(sepp.JobRejectedError) as info:
            await client.enqueue("limited", "x")
        assert isinstance(info.value.rejection, sepp.QueueFull)
        assert info.value.rejection.retryable


async def test_enqueue_batch_mixes_acks_and_rejections_in_order() -> None:
    async with sepp_server(LIMITED) as server, sepp.open(server.address) as client:
        R = sepp.EnqueueRequest
        results = await client.enqueue_batch([R("open", "ok"), R("limited", "no"), R("open", "x")])
        assert isinstance(results[0], sepp.EnqueueAck)
        assert isinstance(results[1], sepp.JobTypeNotAllowed) and results[1].job_type == "no"
        assert isinstance(results[2], sepp.EnqueueAck)


async def test_atomic_enqueue_is_all_or_nothing(client: sepp.Client) -> None:
    R = sepp.EnqueueRequest
    huge = sepp.Payload.bytes(b"x" * (1_048_576 + 1))
    with pytest.raises(sepp.BatchValidationError) as info:
        await client.enqueue_atomic([R("atom", "a"), R("atom", "b", payload=huge), R("atom", "c")])
    assert [e.index for e in info.value.errors] == [1]
    assert isinstance(info.value.errors[0].rejection, sepp.PayloadTooLarge)
    assert await client.reserve("atom", wait_timeout=0) is None
    acks = await client.enqueue_atomic([R("atom", "a"), R("atom", "b")])
    assert len(acks) == 2 and len({a.job_id for a in acks}) == 2
    jobs = await client.reserve("atom", max_jobs=5, wait_timeout=1)
    assert jobs is not None and {j.id for j in jobs} == {a.job_id for a in acks}


RETRY_CONFIG = config(
    storage={"persist_mode": "buffer", "dead_letter_retention_ms": 600_000},
    limits={"max_lease_duration_ms": 60_000},
)


async def test_nack_default_delay_and_dead_letter() -> None:
    async with sepp_server(RETRY_CONFIG) as server, sepp.open(server.address) as client:
        await client.enqueue("n", "t", max_attempts=3, payload=sepp.Payload.text("body"))
        job = await reserve_one(client, "n")
        assert await client.nack(job.ctx, reason="try again") is False
        again = await reserve_one(client, "n")
        assert again.id == job.id and again.ctx.attempt == 2

        nacked_at = trio.current_time()
        assert await client.nack(again.ctx, retry=sepp.Retry.after(1.5)) is False
        assert await client.reserve("n", wait_timeout=0) is None  # not ready yet
        later = await reserve_one(client, "n", wait_timeout=10)
        assert later.ctx.attempt == 3
        assert trio.current_time() - nacked_at >= 1.4  # back only after its delay

        # The final attempt: any nack dead-letters.
        assert await client.nack(later.ctx, reason="out of tries") is True
        await client.enqueue("n", "t2", priority=4, custom={"k": "v"})
        doomed = await reserve_one(client, "n")
        assert await client.nack(doomed.ctx, retry=sepp.Retry.DEAD_LETTER, reason="bad") is True

        records = await client.drain_dead_letters("n", max=10)
        by_type = {r.job_type: r for r in records}
        assert set(by_type) == {"t", "t2"}
        assert by_type["t"].cause is sepp.DeadLetterCause.ATTEMPTS_EXHAUSTED
        assert by_type["t"].last_reason == "out of tries"
        assert by_type["t"].final_attempt == 3
        assert by_type["t"].payload == sepp.Payload.text("body")
        assert by_type["t2"].cause is sepp.DeadLetterCause.REJECTED
        assert by_type["t2"].last_reason == "bad"
        assert by_type["t2"].failed_at is not None
        # Draining deletes; replay makes a fresh job with the same content.
        assert await client.drain_dead_letters("n", max=10) == []
        replay = by_type["t2"].to_enqueue_request()
        ack = await client.enqueue(replay)
        fresh = await reserve_one(client, "n")
        assert fresh.id == ack.job_id != by_type["t2"].job_id
        assert fresh.ctx.attempt == 1 and fresh.ctx.priority == 4
        assert fresh.ctx.custom == {"k": "v"}


async def test_drain_with_max_zero_makes_no_call(sepp_server: SeppServer) -> None:
    async with sepp.open(sepp_server.address) as client:
        await sepp_server.stop()
        assert await client.drain_dead_letters(max=0) == []
        await sepp_server.start()


async def test_extend_moves_lease_and_updates_ctx(client: sepp.Client) -> None:
    await client.enqueue("ext", "t")
    job = await reserve_one(client, "ext", lease_duration=5)
    before = job.ctx.lease_expires_at
    new = await client.extend(job.ctx, 120)
    assert new - before > timedelta(seconds=100)
    assert job.ctx.lease_expires_at == new
    # Clamped to the server's max lease (5 minutes).
    clamped = await client.extend(job.ctx, timedelta(hours=2))
    assert clamped - datetime.now(timezone.utc) <= timedelta(minutes=5, seconds=1)
    await client.ack(job.ctx)


async def test_stale_attempt_raises_attempt_mismatch(client: sepp.Client) -> None:
    await client.enqueue("stale", "t")
    first = await reserve_one(client, "stale", lease_duration=0.2)
    # The sweep requeues the expired lease up to about a second late.
    second = await reserve_one(client, "stale", lease_duration=30, wait_timeout=5)
    assert second.id == first.id and second.ctx.attempt == 2
    with pytest.raises(sepp.AttemptMismatchError) as info:
        await client.ack(first.ctx)
    assert info.value.code is sepp.StatusCode.FAILED_PRECONDITION
    with pytest.raises(sepp.AttemptMismatchError):
        await client.extend(first.ctx, 10)
    await client.ack(second.ctx)
    with pytest.raises(sepp.JobNotFoundError):
        await client.nack(second.ctx)


async def test_unknown_job_id_raises_job_not_found(client: sepp.Client) -> None:
    await client.enqueue("nf", "t")
    job = await reserve_one(client, "nf")
    ghost = dataclasses.replace(job.ctx, id=str(uuid.uuid4()))
    for call in (client.ack(ghost), client.extend(ghost, 5), client.nack(ghost)):
        with pytest.raises(sepp.JobNotFoundError) as info:
            await call
        assert isinstance(info.value, sepp.LeaseError)
        assert not isinstance(info.value, sepp.ClientError)


AUTH = config(auth={"api_keys": [{"name": "suite", "key": "suite-secret-0001"}]})


async def test_api_key_right_wrong_and_missing(caplog: pytest.LogCaptureFixture) -> None:
    async with sepp_server(AUTH) as server:
        async with sepp.open(server.address, api_key="suite-secret-0001") as client:
            assert (await client.get_server_info()).server_version
            await client.enqueue("auth", "t")
            assert await client.reserve("auth", wait_timeout=1) is not None
        assert "plaintext" in caplog.text
        assert "suite-secret-0001" not in caplog.text
        for key in ("wrong-key", None):
            async with sepp.open(server.address, api_key=key) as client:
                with pytest.raises(sepp.UnauthenticatedError) as info:
                    await client.enqueue("auth", "t")
                assert info.value.code is sepp.StatusCode.UNAUTHENTICATED
                assert "suite-secret-0001" not in str(info.value)


async def test_tls_with_private_ca_and_name_override(tmp_path: object) -> None:
    from pathlib import Path

    from fixtures.certificates import CA

    tmp = Path(str(tmp_path))
    ca = CA()
    cert = ca.issue_cert("sepp.test")
    cert_path, key_path, ca_path = tmp / "cert.pem", tmp / "key.pem", tmp / "ca.pem"
    cert_path.write_bytes(cert.cert_chain_pem)
    key_path.write_bytes(cert.key_pem)
    ca_path.write_bytes(ca.cert_pem)
    cfg = config(server={"tls_cert_path": str(cert_path), "tls_key_path": str(key_path)})
    async with sepp_server(cfg) as server:
        async with sepp.open(
            server.address, tls_ca_cert=ca.cert_pem, tls_domain="sepp.test"
        ) as client:
            await client.enqueue("tls", "t")
            assert await client.reserve("tls", wait_timeout=1) is not None
        async with sepp.open(
            f"https://{server.address}", tls_ca_cert=ca_path, tls_domain="sepp.test"
        ) as client:
            assert (await client.get_server_info()).server_version
        # Wrong CA, and right CA but wrong host name: both refused at connect.
        other = CA()
        with pytest.raises(sepp.ConnectError):
            async with sepp.open(
                server.address, tls_ca_cert=other.cert_pem, tls_domain="sepp.test"
            ):
                pass
        with pytest.raises(sepp.ConnectError) as info:
            async with sepp.open(server.address, tls_ca_cert=ca.cert_pem):
                pass
        assert "127.0.0.1" in str(info.value)
        # Plaintext against a TLS server fails rather than hangs.
        with trio.fail_after(10), pytest.raises(sepp.ClientError):
            async with sepp.open(server.address, connect_timeout=2) as client:
                await client.get_server_info(timeout=2)


async def test_response_over_receive_cap_is_message_too_large(sepp_server: SeppServer) -> None:
    async with sepp.open(sepp_server.address) as producer:
        await producer.enqueue("big", "t", payload=sepp.Payload.bytes(b"x" * 50_000))
    async with sepp.open(sepp_server.address, max_receive_message_bytes=10_000) as client:
        with pytest.raises(sepp.MessageTooLargeError) as info:
            await client.reserve("big", wait_timeout=1)
        assert "10000" in str(info.value)
        # The connection stays usable for smaller responses.
        assert (await client.get_server_info()).server_version


async def test_server_stopped_mid_call_then_next_call_reconnects(sepp_server: SeppServer) -> None:
    async with sepp.open(sepp_server.address) as client:
        await client.get_server_info()

        async def kill_soon() -> None:
            # Once the reserve is in flight (its stream open), however long that takes.
            while not (conn := client._channel._current) or not conn.proto.active_calls:  # noqa: ASYNC110
                await trio.sleep(0.01)
            await sepp_server.stop(kill=True)

        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill_soon)
                with pytest.raises(sepp.TransportError) as info:
                    await client.reserve("gone", wait_timeout=10)
        assert info.value.code is sepp.StatusCode.UNAVAILABLE
        with pytest.raises((sepp.ConnectError, sepp.TransportError)):
            await client.enqueue("gone", "t")
        await sepp_server.start()
        ack = await client.enqueue("gone", "t")
        assert ack.job_id


async def test_graceful_server_stop_ends_long_poll(sepp_server: SeppServer) -> None:
    async with sepp.open(sepp_server.address) as client:
        result: list[list[sepp.Job] | None] = []

        async def poll() -> None:
            result.append(await client.reserve("drain", wait_timeout=60))

        with trio.fail_after(30):  # the poll's own wait is 60 s: only the stop can end it
            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                await reserve_parked_on_server(client)
                await sepp_server.stop()
        # SIGTERM, not the SIGKILL stop() falls back to: the server exited by itself, and
        # ended the waiting reserve with an empty reply (None), not an error.
        assert sepp_server.returncode == 0
        assert result == [None]
        await sepp_server.start()
        assert (await client.get_server_info()).server_version


async def test_cancelled_call_leaves_connection_healthy(client: sepp.Client) -> None:
    with trio.move_on_after(0.3) as scope:
        await client.reserve("cancel", wait_timeout=10)
    assert scope.cancelled_caught
    # Another queue: the server may not have seen the reset yet, and would hand a job on the
    # cancelled reserve's queue to that reserve.
    await client.enqueue("cancel-after", "t")
    job = await reserve_one(client, "cancel-after")
    await client.ack(job.ctx)
    assert client._channel.connections_opened == 1


async def test_enclosing_deadline_bounds_the_call(client: sepp.Client) -> None:
    # The 0.5 s scope ends the 60 s long-poll: a call that ran on past it would be ended by
    # the hang guard instead (the outer scope, cancelled, takes the Cancelled).
    with trio.move_on_after(HANG_GUARD_S) as guard:
        with pytest.raises(trio.TooSlowError):
            with trio.fail_after(0.5):
                await client.reserve("deadline", wait_timeout=60)
    assert not guard.cancelled_caught


async def test_per_call_timeout_raises_transport_error(client: sepp.Client) -> None:
    # A 5 s long-poll bounded by a 0.3 s per-call timeout.
    request = b"\x0a\x01q\x12\x02\x08\x05\x1a\x02\x08\x05"
    with pytest.raises(sepp.TransportError) as info:
        await client._send(Call("Reserve", request, kind="reserve"), 0.3)
    assert info.value.code is sepp.StatusCode.DEADLINE_EXCEEDED


async def test_many_concurrent_calls_share_one_connection(client: sepp.Client) -> None:
    acks: list[sepp.EnqueueAck] = []

    async def produce(n: int) -> None:
        for i in range(10):
            acks.append(await client.enqueue("many", "t", idempotency_key=f"{n}-{i}"))

    async with trio.open_nursery() as nursery:
        for n in range(64):
            nursery.start_soon(produce, n)
    assert len({a.job_id for a in acks}) == 640
    assert client._channel.connections_opened == 1
    jobs = await client.reserve("many", max_jobs=256, wait_timeout=1)
    assert jobs is not None and len(jobs) == 256


async def test_unreachable_address_fails_within_connect_timeout() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Refused at once: a connect timeout (60 s) would be ended by the hang guard instead.
    with trio.move_on_after(HANG_GUARD_S) as guard:
        with pytest.raises(sepp.ConnectError) as info:
            async with sepp.open(f"127.0.0.1:{port}", connect_timeout=60):
                pass
    assert not guard.cancelled_caught
    assert info.value.addr == f"127.0.0.1:{port}"
    assert "within" not in info.value.reason  # refused, not timed out


async def test_user_exception_leaves_open_block_unwrapped(client: sepp.Client) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with sepp.open(client.address) as other:
            await other.get_server_info()
            raise Boom


async def test_retry_policy_survives_a_server_restart(
    sepp_server: SeppServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Retries enough to outlast any restart: the hang guard ends the test, not the policy.
    policy = sepp.RetryPolicy(max_attempts=1000, initial_backoff=0.1, max_backoff=0.5)
    async with sepp.open(sepp_server.address, retry_policy=policy) as client:
        await client.get_server_info()
        await sepp_server.stop()

        async def restart_after_a_retry() -> None:
            while "retry 1 of" not in caplog.text:  # noqa: ASYNC110  (the client's log, polled)
                await trio.sleep(0.01)
            await sepp_server.start()

        with trio.fail_after(HANG_GUARD_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(restart_after_a_retry)
                ack = await client.enqueue("retry", "t", idempotency_key="r-1")
        assert ack.job_id
        assert "retry 1 of 999" in caplog.text  # it failed while the server was down


async def test_pointed_at_the_admin_ui_both_clients_say_it_is_probably_not_the_grpc_port() -> None:
    async with sepp_server(config(admin={"enabled": True})) as server:
        with trio.fail_after(30):
            line = await server.wait_for_output(r"admin UI listening at http://127\.0\.0\.1:\d+")
        admin = line.split("http://", 1)[1].split()[0]
        async with sepp.open(admin) as client:
            with pytest.raises(sepp.UnexpectedStatusError) as info:
                await client.get_server_info()

        def blocking() -> None:
            with (
                sepp.SyncClient(admin) as sync,
                pytest.raises(sepp.UnexpectedStatusError) as sync_info,
            ):
                sync.enqueue("q", "t")
            errors.append(sync_info.value)

        errors: list[sepp.UnexpectedStatusError] = [info.value]
        await trio.to_thread.run_sync(blocking)
    for error in errors:
        assert error.code is sepp.StatusCode.UNIMPLEMENTED  # the status itself is unchanged
        assert "HTTP 404" in str(error)
        assert f"{admin} is probably not sepp's gRPC port" in str(error)
        assert "admin UI on 9465" in str(error)


async def test_both_clients_word_a_refused_connection_the_same() -> None:
    with trio.socket.socket() as sock:  # bound, never listening: connections are refused
        await sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(sepp.ConnectError) as info:
            async with sepp.open(address):
                pass

        def blocking() -> str:
            with pytest.raises(sepp.ConnectError) as sync_info:
                sepp.SyncClient(address).connect()
            return str(sync_info.value)

        sync_message = await trio.to_thread.run_sync(blocking)
    assert str(info.value) == sync_message
    assert sync_message.startswith(f"cannot connect to {address}: ConnectionRefusedError: ")


async def test_payloads_of_up_to_one_mib_make_the_round_trip_intact(client: sepp.Client) -> None:
    # The largest payload the server takes (max_payload_bytes, 1 MiB) and 64 KiB ones, all at
    # once: the requests' DATA frames interleave and wait for the server's windows, and go out
    # as views of the encoded requests; the Reserve responses come back over many reads.
    rng = random.Random(27)
    sizes = [1_048_576] * 6 + [65_536] * 6 + [1_048_575, 16_379, 16_384]
    payloads = [sepp.Payload.bytes(rng.randbytes(size)) for size in sizes]
    async with trio.open_nursery() as nursery:
        for payload in payloads:
            nursery.start_soon(functools.partial(client.enqueue, "big", "t", payload=payload))
    # Batches too: each big payload is a part of its own in the request, never joined.
    more = [sepp.Payload.bytes(rng.randbytes(size)) for size in (1_048_576, 40_000, 100)]
    jobs_of = [sepp.EnqueueRequest("big", "t", payload=p) for p in more]
    assert all(isinstance(r, sepp.EnqueueAck) for r in await client.enqueue_batch(jobs_of))
    assert len(await client.enqueue_atomic(jobs_of)) == 3
    payloads += more + more
    reserved: list[sepp.Job] = []
    while len(reserved) < len(payloads):
        jobs = await client.reserve(["big"], max_jobs=8, wait_timeout=2)
        assert jobs, f"only {len(reserved)} of {len(payloads)} jobs came back"
        reserved.extend(jobs)
    assert sorted(job.payload.data for job in reserved if job.payload) == sorted(
        p.data for p in payloads
    )
