"""The memory server's core with no sockets: its rules, clamps, messages and time, given
states and times directly."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from fixtures.fuzz import examples
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from sepp._pb import queue_pb2 as pb
from sepp.testing import ConfigError, ManualClock
from sepp.testing._memory import rules
from sepp.testing._memory.config import load_config
from sepp.testing._memory.service import (
    QueueService,
    Reply,
    Waiting,
    policy_retry_delay_ms,
    siphash13,
)
from sepp.testing._memory.state import QueueState

NOW = 1_700_000_000_000


def test_the_jitter_hash_is_the_servers():
    # Computed by rustc 1.95's std DefaultHasher: hash(&str) then hash(u32), finish().
    cases = [
        ("", 0, 6540239196322574060),
        ("0f8fad5b-d9cb-469f-a165-70867728950e", 1, 11600548284022871239),
        ("7c9e6679-7425-40de-944b-e07fc1f90ae7", 2, 6777496303496665761),
        ("abc", 3, 15165737856191685689),
        ("x", 4000000000, 18433713355186878725),
    ]
    for text, attempt, expected in cases:
        assert siphash13(text.encode() + b"\xff" + attempt.to_bytes(4, "little")) == expected


def test_the_retry_policy_grows_caps_and_jitters_down_by_a_quarter_at_most():
    job = "0f8fad5b-d9cb-469f-a165-70867728950e"
    kw = {"exponential": True, "max_delay_ms": 8000, "job_id": job}
    delays = [policy_retry_delay_ms(delay_ms=1000, attempt=a, **kw) for a in range(1, 8)]
    for attempt, delay in enumerate(delays, start=1):
        full = min(1000 * 2 ** (attempt - 1), 8000)
        assert full * 3 / 4 <= delay <= full
    assert policy_retry_delay_ms(delay_ms=0, attempt=3, **kw) == 0
    assert policy_retry_delay_ms(delay_ms=5, attempt=4_000_000_000, **kw) <= 8000  # saturates


def test_rust_debug_quotes_as_the_server_does():
    # rustc's `{:?}` of these strings.
    assert rules.rust_debug('a"b') == '"a\\"b"'
    assert rules.rust_debug("tab\there") == '"tab\\there"'
    assert rules.rust_debug("é日本😀") == '"é日本😀"'
    assert rules.rust_debug("x\u0301") == '"x\\u{301}"'
    assert rules.rust_debug("\u200bz\u00ad\ue000\ufe0f") == '"\\u{200b}z\\u{ad}\\u{e000}\\u{fe0f}"'
    assert rules.rust_debug("back\\slash 'q'") == "\"back\\\\slash 'q'\""
    assert rules.rust_debug_list(["a", "b"]) == '["a", "b"]'


def test_uuids_are_the_canonical_hyphenated_form_either_case():
    assert rules.is_uuid("0f8fad5b-d9cb-469f-a165-70867728950e")
    assert rules.is_uuid("0F8FAD5B-D9CB-469F-A165-70867728950E")
    assert not rules.is_uuid("0f8fad5bd9cb469fa16570867728950e")
    assert not rules.is_uuid("0f8fad5b-d9cb-469f-a165-70867728950")
    assert not rules.is_uuid("0f8fad5b-d9cb-469f-a165-70867728950é")


@settings(max_examples=examples(200))
@given(seconds=st.integers(-(2**40), 2**40), nanos=st.integers(-(2**31), 2**31 - 1))
def test_a_timestamp_is_read_normalized_and_floored(seconds: int, nanos: int) -> None:
    stamp = Timestamp(seconds=seconds, nanos=nanos)
    total_ns = seconds * 1_000_000_000 + nanos
    assert rules.timestamp_ms(stamp) == total_ns // 1_000_000


@settings(max_examples=examples(200))
@given(seconds=st.integers(-(2**40), 2**40), nanos=st.integers(-999_999_999, 999_999_999))
def test_a_duration_counts_its_negative_parts_as_zero(seconds: int, nanos: int) -> None:
    ms = rules.duration_ms(Duration(seconds=seconds, nanos=nanos))
    total_ns = seconds * 1_000_000_000 + nanos
    if total_ns <= 0:
        assert ms == 0
    else:
        assert ms == total_ns // 1_000_000


def _service(config: dict[str, object] | None = None) -> QueueService:
    parsed = load_config(config)
    return QueueService(
        parsed, QueueState(dead_letter_retention_ms=parsed.dead_letter_retention_ms)
    )


def _enqueue(service: QueueService, now: int, *jobs: pb.EnqueueRequest) -> list[str]:
    reply = service.call(
        "/sepp.v1.QueueService/EnqueueBatch",
        pb.EnqueueBatchRequest(jobs=list(jobs)).SerializeToString(),
        now,
    )
    assert isinstance(reply, Reply) and reply.body is not None
    results = pb.EnqueueBatchResponse.FromString(reply.body).results
    return [r.success.job_id or r.WhichOneof("outcome") for r in results]


def _reserve(service: QueueService, now: int, *queues: str, **kw: object) -> list[pb.Job]:
    request = pb.ReserveRequest(queues=list(queues))
    request.lease_duration.FromMilliseconds(int(kw.pop("lease_ms", 30_000)))  # type: ignore[call-overload]
    for name, value in kw.items():
        setattr(request, name, value)
    reply = service.call("/sepp.v1.QueueService/Reserve", request.SerializeToString(), now)
    assert isinstance(reply, Reply), reply
    return list(pb.ReserveResponse.FromString(reply.body or b"").jobs)


def test_time_is_what_the_calls_are_given():
    service = _service()
    later = pb.EnqueueRequest(queue="q", job_type="t")
    later.scheduled_at.FromMilliseconds(NOW + 30 * 86_400_000)  # the horizon exactly
    [job_id] = _enqueue(service, NOW, later)
    assert _reserve(service, NOW + 30 * 86_400_000 - 1, "q") == []
    [job] = _reserve(service, NOW + 30 * 86_400_000, "q", lease_ms=1000)
    assert (
        job.id == job_id and job.lease_expires_at.ToMilliseconds() == NOW + 30 * 86_400_000 + 1000
    )
    # The lease runs out at its millisecond: redelivered, attempt 2.
    assert _reserve(service, NOW + 30 * 86_400_000 + 999, "q") == []
    [again] = _reserve(service, NOW + 30 * 86_400_000 + 1000, "q")
    assert again.attempt == 2 and again.enqueued_at.ToMilliseconds() == NOW


def test_an_empty_reserve_that_may_wait_comes_back_as_waiting():
    service = _service({"limits": {"max_wait_timeout_ms": 5000, "max_reserve_batch": 3}})
    request = pb.ReserveRequest(queues=["q"], max_jobs=10)
    request.lease_duration.FromMilliseconds(100)
    request.wait_timeout.FromSeconds(60)
    waiting = service.call("/sepp.v1.QueueService/Reserve", request.SerializeToString(), NOW)
    assert waiting == Waiting(["q"], 100, 3, 5000)  # clamped
    assert service.retry_reserve(waiting, NOW) is None
    _enqueue(service, NOW, pb.EnqueueRequest(queue="q", job_type="t"))
    assert service.state.take_new_ready() == {"q"}
    reply = service.retry_reserve(waiting, NOW)
    assert reply is not None and len(pb.ReserveResponse.FromString(reply.body or b"").jobs) == 1


def test_api_keys_are_checked_before_anything_and_not_for_health():
    service = _service({"auth": {"api_keys": [{"name": "n", "key": "secret"}]}})
    path = "/sepp.v1.QueueService/Ack"
    assert service.authorize(path, b"Bearer secret") is None
    assert service.authorize(path, b"Bearer other") == Reply(16, "invalid API key")
    missing = service.authorize(path, None)
    assert missing is not None and missing.message.startswith("missing API key")
    assert service.authorize(path, b"secret") == missing
    assert service.authorize("/grpc.health.v1.Health/Check", None) is None


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"limits": {"max_reserve_batch": 0}}, "max_reserve_batch"),
        ({"limits": {"default_max_attempts": 5, "max_attempts_ceiling": 3}}, "ceiling"),
        ({"limits": {"max_payload_bytes": 10, "max_message_bytes": 5}}, "max_message_bytes"),
        ({"queues": [{"name": "a"}, {"name": "a"}]}, "duplicate"),
        ({"queues": [{"name": "a/b"}]}, "'/'"),
        ({"queues": [{"name": "q", "allowed_job_types": []}]}, "allowed_job_types"),
        ({"auth": {"api_keys": [{"name": "n", "key": "has space"}]}}, "visible ASCII"),
        ({"server": {"tls_cert_path": "c.pem", "tls_key_path": "k.pem"}}, "TLS"),
        ({"limits": {"max_lease_duration": 5}}, "unknown config key"),
        ("[limits\nbroken", "cannot read"),
    ],
)
def test_a_config_the_server_would_refuse_is_refused(config: object, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config(config)  # type: ignore[arg-type]


def test_the_config_comes_as_toml_text_or_a_file(tmp_path):
    text = '[server]\nstrict_queues = true\n\n[[queues]]\nname = "emails"\nmax_queue_depth = 2\n'
    path = tmp_path / "sepp.toml"
    path.write_text(text)
    for source in (text, path):
        config = load_config(source)
        assert config.strict_queues and config.limits("emails").max_queue_depth == 2
        assert config.limits("other").max_queue_depth is None


def test_a_manual_clock_moves_only_forward_and_says_so():
    start = datetime(2030, 1, 1, tzinfo=timezone.utc)
    clock = ManualClock(start)
    moved = []
    stop = clock.watch(lambda: moved.append(clock.now()))
    clock.advance(timedelta(days=30))
    clock.advance(1.5)
    assert clock.now() == start + timedelta(days=30, seconds=1.5)
    assert clock.now_ms() == int((start + timedelta(days=30, seconds=1.5)).timestamp() * 1000)
    with pytest.raises(ValueError, match="does not go back"):
        clock.set(start)
    stop()
    clock.set(start + timedelta(days=31))
    assert len(moved) == 2
    assert clock.runtime_at(clock.now_ms() + 1, 5.0) is None  # it does not move by itself
    assert clock.runtime_at(clock.now_ms(), 5.0) == 5.0


def test_a_call_past_its_grpc_timeout_is_cancelled_and_forgets_its_wait():
    from sepp.testing._memory.calls import Call
    from sepp.testing._memory.clock import ManualClock as Clock
    from sepp.testing._memory.core import ServerCore

    now = [0.0]
    answers: list[Reply] = []

    class Connection:
        def respond(self, call: Call, reply: Reply) -> None:
            call.answered = True
            answers.append(reply)

    core = ServerCore(load_config({}), clock=Clock(), runtime_now=lambda: now[0])
    call = Call(Connection(), 1)
    call.path, call.deadline = "/sepp.v1.QueueService/Reserve", 2.0
    core.started(call)
    request = pb.ReserveRequest(queues=["q"])
    request.lease_duration.FromSeconds(30)
    request.wait_timeout.FromSeconds(60)
    core.dispatch(call, request.SerializeToString())
    assert answers == [] and core.next_wakeup() == 2.0  # the deadline, before the wait's end
    now[0] = 2.0
    core.on_time()
    assert answers == [Reply(1, "Timeout expired")]
    assert core.next_wakeup() == float("inf")  # the wait went with it
    health = core.service.call("/grpc.health.v1.Health/Check", b"\n\x14sepp.v1.QueueService", 0)
    assert health == Reply(body=b"\x08\x01")
    unknown = core.service.call("/grpc.health.v1.Health/Check", b"\n\x03xyz", 0)
    assert unknown == Reply(5, "service not registered")
