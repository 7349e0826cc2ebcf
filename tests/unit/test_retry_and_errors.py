"""The retry loop (deterministic under MockClock) and the one status→error mapper."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import sepp
from sepp._client.retry import call_with_retry
from sepp._model.errors import error_from_status
from sepp._util.log import Log
from sepp.wire._failure import FailureKind
from sepp.wire._status import StatusCode
from sepp.wire.drivers._trio import RpcError

S = StatusCode


class Script:
    """An attempt function failing with the given codes, then succeeding."""

    def __init__(self, *codes: StatusCode, kind: FailureKind | None = None) -> None:
        self.codes = list(codes)
        self.kind = kind
        self.calls: list[float] = []

    async def __call__(self) -> str:
        self.calls.append(trio.current_time())
        if self.codes:
            raise RpcError(self.codes.pop(0), "scripted", self.kind)
        return "ok"


async def test_default_policy_makes_exactly_one_call() -> None:
    script = Script(S.UNAVAILABLE)
    with pytest.raises(RpcError):
        await call_with_retry(
            sepp.RetryPolicy(), script, method="M", log=Log(None), sleep=trio.sleep
        )
    assert len(script.calls) == 1


async def test_retries_with_exponential_backoff_then_gives_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = sepp.RetryPolicy(max_attempts=4, initial_backoff=0.1, max_backoff=0.3, jitter=False)
    script = Script(S.UNAVAILABLE, S.RESOURCE_EXHAUSTED, S.DEADLINE_EXCEEDED, S.ABORTED)
    with pytest.raises(RpcError) as info:
        await call_with_retry(policy, script, method="M", log=Log(None), sleep=trio.sleep)
    assert info.value.code is S.ABORTED
    gaps = [round(b - a, 6) for a, b in zip(script.calls, script.calls[1:], strict=False)]
    assert gaps == [0.1, 0.2, 0.3]


async def test_jittered_delays_stay_in_half_to_full_range(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = sepp.RetryPolicy(max_attempts=6, initial_backoff=1.0, max_backoff=1.0)
    script = Script(*[S.UNAVAILABLE] * 5)
    assert (
        await call_with_retry(policy, script, method="M", log=Log(None), sleep=trio.sleep) == "ok"
    )
    gaps = [b - a for a, b in zip(script.calls, script.calls[1:], strict=False)]
    assert len(gaps) == 5 and all(0.5 <= g < 1.0 + 1e-9 for g in gaps)


@pytest.mark.parametrize(
    "code",
    [S.INVALID_ARGUMENT, S.CANCELLED, S.INTERNAL, S.NOT_FOUND, S.UNAUTHENTICATED],
)
async def test_non_retryable_codes_are_called_once(code: StatusCode) -> None:
    policy = sepp.RetryPolicy(max_attempts=3, initial_backoff=0.001)
    script = Script(code)
    with pytest.raises(RpcError):
        await call_with_retry(policy, script, method="M", log=Log(None), sleep=trio.sleep)
    assert len(script.calls) == 1


@pytest.mark.parametrize(
    ("code", "kind", "expected_calls"),
    [
        (S.DEADLINE_EXCEEDED, FailureKind.DEADLINE, 1),
        (S.ABORTED, None, 1),
        (S.UNAVAILABLE, FailureKind.CONNECTION, 1),  # lost mid-call: the job may be committed
        (S.UNAVAILABLE, FailureKind.PROTOCOL, 1),
        (S.UNAVAILABLE, FailureKind.CONNECT, 2),  # never reached the server
        (S.UNAVAILABLE, FailureKind.GOAWAY, 2),  # above last_stream_id: not processed
        (S.UNAVAILABLE, FailureKind.RESET, 2),  # REFUSED_STREAM after headers
        (S.UNAVAILABLE, FailureKind.REFUSED, 2),  # REFUSED_STREAM past the transparent retries
        (S.UNAVAILABLE, FailureKind.UNSENT, 2),  # the request never left
        (S.RESOURCE_EXHAUSTED, None, 2),
    ],
)
async def test_keyless_enqueue_retries_only_failures_that_precede_the_server(
    code: StatusCode, kind: str | None, expected_calls: int
) -> None:
    policy = sepp.RetryPolicy(max_attempts=3, initial_backoff=0.001)
    script = Script(code, kind=kind)
    attempt = call_with_retry(
        policy, script, method="M", log=Log(None), ambiguous_retry_safe=False, sleep=trio.sleep
    )
    if expected_calls == 1:
        with pytest.raises(RpcError):
            await attempt
    else:
        assert await attempt == "ok"
    assert len(script.calls) == expected_calls


async def test_local_too_large_verdict_is_never_retried() -> None:
    policy = sepp.RetryPolicy(max_attempts=3, initial_backoff=0.001)
    script = Script(S.RESOURCE_EXHAUSTED, kind=FailureKind.TOO_LARGE)
    with pytest.raises(RpcError):
        await call_with_retry(policy, script, method="M", log=Log(None), sleep=trio.sleep)
    assert len(script.calls) == 1


async def test_backoff_sleep_honours_cancellation(autojump_clock: trio.testing.MockClock) -> None:
    policy = sepp.RetryPolicy(max_attempts=3, initial_backoff=100, max_backoff=100, jitter=False)
    script = Script(S.UNAVAILABLE, S.UNAVAILABLE)
    with trio.move_on_after(5) as scope:
        await call_with_retry(policy, script, method="M", log=Log(None), sleep=trio.sleep)
    assert scope.cancelled_caught and len(script.calls) == 1


@pytest.mark.parametrize(
    ("code", "call", "expected"),
    [
        (S.UNAVAILABLE, "generic", sepp.TransportError),
        (S.DEADLINE_EXCEEDED, "generic", sepp.TransportError),
        (S.ABORTED, "lease", sepp.TransportError),
        (S.CANCELLED, "reserve", sepp.TransportError),
        (S.UNAUTHENTICATED, "generic", sepp.UnauthenticatedError),
        (S.PERMISSION_DENIED, "lease", sepp.UnauthenticatedError),
        (S.RESOURCE_EXHAUSTED, "generic", sepp.OverloadedError),
        (S.INVALID_ARGUMENT, "generic", sepp.InvalidRequestError),
        (S.INTERNAL, "generic", sepp.ServerInternalError),
        (S.DATA_LOSS, "generic", sepp.ServerInternalError),
        (S.UNKNOWN, "generic", sepp.ServerInternalError),
        (S.NOT_FOUND, "generic", sepp.UnexpectedStatusError),
        (S.NOT_FOUND, "lease", sepp.JobNotFoundError),
        (S.FAILED_PRECONDITION, "generic", sepp.UnexpectedStatusError),
        (S.FAILED_PRECONDITION, "lease", sepp.AttemptMismatchError),
        (S.FAILED_PRECONDITION, "reserve", sepp.UnknownQueuesError),
        (S.UNIMPLEMENTED, "generic", sepp.UnexpectedStatusError),
    ],
)
def test_status_mapping(code: StatusCode, call: str, expected: type[Exception]) -> None:
    err = error_from_status(code, "server says", call=call, method="Ack")  # type: ignore[arg-type]
    assert type(err) is expected
    assert isinstance(err, sepp.SeppError)
    assert "server says" in str(err)
    assert err.code is code  # type: ignore[attr-defined]
    assert err.details == "server says"  # type: ignore[attr-defined]


def test_local_kinds_map_to_their_own_errors() -> None:
    too_large = error_from_status(S.RESOURCE_EXHAUSTED, "big", kind=FailureKind.TOO_LARGE)
    assert type(too_large) is sepp.MessageTooLargeError
    assert (
        type(error_from_status(S.INTERNAL, "x", kind=FailureKind.COMPRESSED))
        is sepp.MalformedResponseError
    )
    connect = error_from_status(S.UNAVAILABLE, "refused", kind=FailureKind.CONNECT, addr="h:1")
    assert isinstance(connect, sepp.ConnectError) and connect.addr == "h:1"


def test_rejected_and_lease_errors_are_not_client_errors() -> None:
    assert not issubclass(sepp.JobRejectedError, sepp.ClientError)
    assert not issubclass(sepp.LeaseError, sepp.ClientError)
    err = sepp.JobRejectedError(sepp.QueueFull("q", 5))
    assert "full" in str(err) and err.rejection == sepp.QueueFull("q", 5)
