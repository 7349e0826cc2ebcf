"""Jobs over the server's advertised limits are rejected locally with the server's values."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from fixtures.counting import count_calls

import sepp
from sepp.testing import sepp_server

R = sepp.EnqueueRequest
CONFIG = {
    "admin": {"enabled": False},
    "storage": {"persist_mode": "buffer"},
    "limits": {
        "max_payload_bytes": 100,
        "allowed_encodings": ["application/json"],
        "max_custom_entries": 2,
        "max_custom_total_bytes": 40,
        "max_custom_key_bytes": 8,
        "max_queue_name_bytes": 16,
        "max_job_type_bytes": 8,
        "max_idempotency_key_bytes": 8,
        "max_schedule_horizon_ms": 60_000,
    },
}


def over_limit_jobs() -> list[sepp.EnqueueRequest]:
    far = datetime.now(timezone.utc) + timedelta(hours=1)
    return [
        R("q", "ok", payload=sepp.Payload.json("x" * 200)),
        R("q", "ok", payload=sepp.Payload.text("hi")),
        R("q", "ok", custom={"a": 1, "b": 2, "c": 3}),
        R("q", "ok", custom={"a": "y" * 50}),
        R("q", "ok", custom={"k" * 9: 1}),
        R("q" * 17, "ok"),
        R("q", "t" * 9),
        R("q", "ok", idempotency_key="k" * 9),
        R("q", "ok", scheduled_at=far),
    ]


async def test_local_rejections_equal_the_servers() -> None:
    async with sepp_server(CONFIG) as server:
        async with sepp.open(server.address, validate_locally=False) as remote:
            from_server = await remote.enqueue_batch(over_limit_jobs())
        async with sepp.open(server.address) as client:
            await client.get_server_info()  # warm the cache so the count below is exact
            calls = count_calls(client)
            local = await client.enqueue_batch(over_limit_jobs())
            assert calls == []  # nothing the server would reject was sent
            with pytest.raises(sepp.BatchValidationError) as info:
                await client.enqueue_atomic([R("q", "ok"), *over_limit_jobs()[:2]])
            assert [e.index for e in info.value.errors] == [1, 2]
            assert calls == []
            mixed = await client.enqueue_batch([R("q", "ok"), over_limit_jobs()[0]])
            assert isinstance(mixed[0], sepp.EnqueueAck)
            assert isinstance(mixed[1], sepp.PayloadTooLarge)
            assert calls == ["EnqueueBatch"]
    for got, want in zip(local, from_server, strict=True):
        if isinstance(want, sepp.ScheduledTooFar):
            assert isinstance(got, sepp.ScheduledTooFar) and got.horizon == want.horizon
        else:
            assert got == want


async def test_single_enqueue_with_batching_is_checked_locally() -> None:
    async with (
        sepp_server(CONFIG) as server,
        sepp.open(server.address, enqueue_batching=sepp.Batching()) as client,
    ):
        with pytest.raises(sepp.JobRejectedError) as info:
            await client.enqueue("q", "t" * 9)
        assert info.value.rejection == sepp.JobTypeNameTooLong(8, 9)
        assert (await client.enqueue("q", "ok")).job_id
