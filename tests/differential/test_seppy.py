"""The official grpcio client, sepp-py, against the memory server: one scenario driven through
it (tests/peers/seppy_driver.py, its own virtualenv) on the real server and on the memory
server at once, what it returned compared — so the memory server serves grpcio's HTTP/2
(HPACK with a dynamic table, its pings and flow control) as the real server does."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import trio
from both_servers import servers
from peers.seppy import b64, seppy_driver

pytestmark = pytest.mark.differential

CONFIG: dict[str, Any] = {
    "storage": {"dead_letter_retention_ms": 600_000},
    "limits": {"max_payload_bytes": 64},
    "queues": [{"name": "typed", "allowed_job_types": ["ok"]}],
}
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIMES = ("enqueued_at", "lease_expires_at", "failed_at", "server_time")


def _normalized(value: Any, labels: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {
            k: ("<time>" if k in _TIMES and v else _normalized(v, labels)) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_normalized(item, labels) for item in value]
    if isinstance(value, str):
        return _UUID.sub(lambda m: labels.setdefault(m.group(), f"j{len(labels)}"), value)
    return value


async def _play(address: str, scheduled: str) -> list[Any]:
    out: list[Any] = []
    async with seppy_driver(address) as seppy:

        async def call(op: str, **args: Any) -> Any:
            try:
                result = await seppy.call(op, **args)
            except Exception as exc:  # sepp-py's error, by type and message
                result = {"error": str(exc)}
            out.append((op, result))
            return result

        await call("get_server_info")
        first = await call(
            "enqueue",
            queue="q",
            job_type="t",
            payload_b64=b64(b"hello"),
            encoding="text/plain",
            priority=7,
            max_attempts=2,
            custom={"s": {"t": "s", "v": "x"}, "i": {"t": "i", "v": "3"}},
            idempotency_key="key-1",
        )
        await call("enqueue", queue="q", job_type="t", idempotency_key="key-1")
        await call("enqueue", queue="q", job_type="late", scheduled_at=scheduled)
        await call("enqueue", queue="q", job_type="big", payload_b64=b64(b"x" * 65), encoding="e")
        await call("enqueue", queue="typed", job_type="other")
        await call(
            "enqueue_batch", jobs=[{"queue": "q", "job_type": "b"}, {"queue": "", "job_type": "b"}]
        )
        await call(
            "enqueue_atomic",
            jobs=[{"queue": "typed", "job_type": "ok"}, {"queue": "typed", "job_type": "no"}],
        )
        jobs = await call("reserve", queues=["q"], lease_s=30, wait_s=0.1, max_jobs=5)
        await call("extend", job_id=first["job_id"], lease_s=60)
        await call("nack", job_id=first["job_id"], retry={"after_s": 0}, reason="again")
        await call("ack", job_id=first["job_id"], attempt=1)  # a stale attempt
        again = await call("reserve", queues=["q"], lease_s=30, wait_s=0.1, max_jobs=5)
        await call("nack", job_id=first["job_id"], retry="default", reason="last")  # exhausted
        await call("drain_dead_letters", queue="q", max=5)
        for job in [*(jobs or []), *(again or [])]:
            if job["id"] != first["job_id"]:
                await call("ack", job_id=job["id"])
        await call("reserve", queues=["q"], lease_s=30, wait_s=0.2)
    return out


@pytest.mark.parametrize("engine", ["codec", "h2"])
async def test_seppy_answers_alike_on_both_servers(engine: str) -> None:
    scheduled = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)
    async with servers(CONFIG, wire_engine=engine) as (real_address, memory_address):
        results: dict[str, list[Any]] = {}

        async def run(name: str, address: str) -> None:
            results[name] = await _play(address, scheduled.isoformat())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "real", real_address)
            nursery.start_soon(run, "memory", memory_address)
    real = _normalized(results["real"], {})
    memory = _normalized(results["memory"], {})
    assert len(real) == len(memory) >= 15
    for index, (a, b) in enumerate(zip(real, memory, strict=True)):
        assert a == b, f"sepp-py's answer #{index} differs:\n real:   {a!r}\n memory: {b!r}"
    assert any("dead" in repr(entry) for entry in memory)  # the drain found the dead letter
