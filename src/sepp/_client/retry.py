"""RetryPolicy and the one retry loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from .._model import validate as v
from .._model.backoff import backoff_delay
from .._model.errors import ValidationError
from .._util.log import Log
from ..wire._status import StatusCode
from ..wire.drivers._base import RpcError

T = TypeVar("T")

RETRYABLE = frozenset(
    {
        StatusCode.UNAVAILABLE,
        StatusCode.DEADLINE_EXCEEDED,
        StatusCode.ABORTED,
        StatusCode.RESOURCE_EXHAUSTED,
    }
)
# Codes after which an un-keyed enqueue may already have been committed.
AMBIGUOUS = frozenset({StatusCode.DEADLINE_EXCEEDED, StatusCode.ABORTED})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Client-side retries of transient failures, with exponential backoff.

    `max_attempts` counts the first call (1 = no retries, the default). Each delay is the
    previous one times `multiplier`, capped at `max_backoff`; with `jitter` each sleep is
    drawn from [0.5, 1.0) of it. Durations are seconds or timedelta.
    """

    max_attempts: int = 1
    initial_backoff: float | timedelta = 0.1
    max_backoff: float | timedelta = 5.0
    multiplier: float = 2.0
    jitter: bool = True

    def __post_init__(self) -> None:
        v.whole_number("retry_policy.max_attempts", self.max_attempts, low=1, high=1000)
        v.seconds("retry_policy.initial_backoff", self.initial_backoff, allow_zero=True)
        v.seconds("retry_policy.max_backoff", self.max_backoff, allow_zero=True)
        if isinstance(self.multiplier, bool) or not isinstance(self.multiplier, (int, float)):
            raise ValidationError("retry_policy.multiplier", "must be a number")
        if not self.multiplier >= 1.0:
            raise ValidationError("retry_policy.multiplier", "must be at least 1.0")

    def delays(self) -> list[float]:
        """The un-jittered sleeps between attempts."""
        return [self._delay(retry, jitter=0.0) for retry in range(1, self.max_attempts)]

    def _delay(self, retry: int, *, jitter: float) -> float:
        """The sleep before retry `retry` (1: after the first call failed)."""
        return backoff_delay(
            retry,
            initial=v.seconds("initial_backoff", self.initial_backoff, allow_zero=True),
            multiplier=self.multiplier,
            cap=v.seconds("max_backoff", self.max_backoff, allow_zero=True),
            jitter=jitter,
        )


NO_RETRY = RetryPolicy()


async def call_with_retry(
    policy: RetryPolicy,
    attempt: Callable[[], Awaitable[T]],
    *,
    method: str,
    log: Log,
    retryable: frozenset[StatusCode] = RETRYABLE,
    ambiguous_retry_safe: bool = True,
    sleep: Callable[[float], Awaitable[None]],
) -> T:
    """Run `attempt` until it succeeds, fails for good, or the policy is used up; `sleep` is
    the caller's runtime's.

    With `ambiguous_retry_safe=False` (an enqueue with un-keyed jobs), failures that may hide
    a commit are not retried: DEADLINE_EXCEEDED, ABORTED and connections lost mid-call.
    """
    retries = policy.max_attempts - 1
    for index in range(policy.max_attempts):
        try:
            return await attempt()
        except RpcError as exc:
            kind = exc.kind
            if index >= retries or exc.code not in retryable or (kind and kind.final):
                raise
            # After an ambiguous failure (the connection died with the call in flight, the
            # peer broke HTTP/2 mid-read, a deadline) a commit may hide: see FailureKind.
            if not ambiguous_retry_safe and (exc.code in AMBIGUOUS or (kind and kind.ambiguous)):
                raise
            delay = policy._delay(index + 1, jitter=0.5 if policy.jitter else 0.0)
            log.warning(
                "sepp: %s failed with %s (%s); retry %d of %d in %.3fs",
                method,
                exc.code.name,
                exc.details,
                index + 1,
                retries,
                delay,
            )
            await sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
