"""What a handler's end means for its job: HandlerError, and the ack or nack it turns into."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from .errors import ValidationError
from .types import JobContext, Retry

# Nack reasons are for humans reading dead letters; keep them bounded.
MAX_REASON_CHARS = 1000
SHUTDOWN_REASON = "worker shutdown"

# What a payload that does not decode into its handler's type gets (Router, Task option).
OnInvalid = Literal["dead_letter", "retry"]


def check_on_invalid(value: object) -> OnInvalid:
    if value not in ("dead_letter", "retry"):
        raise ValidationError("on_invalid", f"must be 'dead_letter' or 'retry', got {value!r}")
    return value


class HandlerError(Exception):
    """Raise from a handler to choose how its job is nacked (not a SeppError: user code raises
    it). Build one with `retry`, `retry_after` or `permanent`; `directive` is the outcome it
    asks for, which a middleware reads to tell a permanent failure from one to retry, and
    `reason` says why."""

    __module__ = "sepp"  # tracebacks and reprs name it as users import it: sepp.HandlerError

    def __init__(self, reason: str, directive: Retry = Retry.DEFAULT) -> None:
        if not isinstance(directive, Retry):
            raise ValidationError("directive", "must be a sepp.Retry")
        super().__init__(reason)
        self._reason = reason
        self._directive = directive

    @property
    def reason(self) -> str:
        """Why: the nack's reason, which a dead letter keeps as its `last_reason`."""
        return self._reason

    @property
    def directive(self) -> Retry:
        """The outcome asked for, a `sepp.Retry`: `Retry.DEFAULT` from `retry` (after the
        handler's backoff delay, or the queue's retry policy with a `sepp.Retry.DEFAULT`
        backoff), `Retry.after(delay)` from `retry_after` (`directive.delay`, a timedelta), or
        `Retry.DEAD_LETTER` from `permanent` (to the dead letters, never retried). Compare it
        with `==`, or read `directive.kind`: "default", "delay" or "dead_letter". The server
        dead-letters any nack on a job's final attempt, whatever it asks."""
        return self._directive

    @classmethod
    def retry(cls, reason: str) -> HandlerError:
        """Nack for a retry paced by the handler's backoff (as any other exception is)."""
        return cls(reason, Retry.DEFAULT)

    @classmethod
    def retry_after(cls, reason: str, delay: float | timedelta) -> HandlerError:
        """Nack so the job comes back after `delay` (seconds or timedelta, ≥ 0)."""
        return cls(reason, Retry.after(delay))

    @classmethod
    def permanent(cls, reason: str) -> HandlerError:
        """Nack straight to the dead-letter store."""
        return cls(reason, Retry.DEAD_LETTER)

    def __repr__(self) -> str:
        return f"HandlerError({self.reason!r}, {self.directive!r})"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to tell the server about a job: ack (retry None) or nack."""

    retry: Retry | None = None
    reason: str | None = None
    label: str = "ack"  # for spans, metrics and logs
    failure: str | None = None  # set when the handler failed: marks the process span
    error: BaseException | None = None  # the handler's exception, for the log's traceback
    delay_s: float | None = None  # the retry's delay, when the worker chose it


ACK = Outcome()
SHUTDOWN = Outcome(Retry.after(0), SHUTDOWN_REASON, "shutdown")


def clip_reason(text: str) -> str:
    # Handlers build reasons from arbitrary exceptions: keep them short and valid UTF-8.
    clipped = text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"
    return clipped.encode("utf-8", "replace").decode("utf-8")


def describe(exc: BaseException) -> str:
    """`Type: message`; for an exception group, its type and every leaf."""
    if isinstance(exc, BaseExceptionGroup):
        return f"{type(exc).__name__} ({'; '.join(describe(leaf) for leaf in _leaves(exc))})"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions in a (nested) exception group, or the exception itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def logged_traceback(outcome: Outcome) -> BaseException | None:
    """The exception whose traceback a log line about `outcome` shows: none for a
    HandlerError (or a group of them), a decision the handler made and its reason says."""
    error = outcome.error
    if error is None or all(isinstance(leaf, HandlerError) for leaf in _leaves(error)):
        return None
    return error


def unknown_type(ctx: JobContext, delay_s: float | None) -> Outcome:
    """No handler for the job's type: back to the queue after `delay_s`, so a newer worker
    that knows the type can take it; None dead-letters it now."""
    reason = clip_reason(f"no handler registered for job type {ctx.job_type!r} on this worker")
    retry = Retry.DEAD_LETTER if delay_s is None else Retry.after(delay_s)
    return Outcome(retry, reason, "unknown_type", reason, None, delay_s)


def requested(error: Exception) -> Outcome | None:
    """The nack a HandlerError asks for, also when it arrives in an exception group (a child
    of the handler's nursery raised it): a group of HandlerErrors only takes the strongest
    (permanent, else the longest retry_after, else retry). None for any other exception, or
    a group holding one. A plain retry has `Retry.DEFAULT`: the worker applies its backoff."""
    leaves = _leaves(error)
    wanted = [leaf for leaf in leaves if isinstance(leaf, HandlerError)]
    if not wanted or len(wanted) != len(leaves):
        return None
    strongest = max(wanted, key=_strength)
    label = {"default": "retry", "delay": "retry_after"}.get(strongest.directive.kind, "permanent")
    reason = clip_reason(strongest.reason)
    return Outcome(strongest.directive, reason, label, reason, error)


def _strength(error: HandlerError) -> tuple[int, float]:
    directive = error.directive
    if directive.kind == "dead_letter":
        return (2, 0.0)
    if directive.kind == "delay" and directive.delay is not None:
        return (1, directive.delay.total_seconds())
    return (0, 0.0)


def failed(error: Exception, label: str = "error") -> Outcome:
    """Any other exception: nack for a retry (the worker applies its backoff), the reason
    naming it. `label` is "timeout" when the handler's timeout cancelled it."""
    reason = clip_reason(f"handler raised {describe(error)}")
    return Outcome(Retry.DEFAULT, reason, label, reason, error)


def given_up(error: Exception, why: str) -> Outcome:
    """An exception the handler's failure policy does not retry (`why` says which rule): to the
    dead letters at once, the reason naming the exception and the rule."""
    head = f"handler raised {describe(error)}"
    room = MAX_REASON_CHARS - len(why) - 3  # the rule is kept whole; a long message is cut
    if len(head) > room:
        head = head[: room - 1] + "…"
    reason = clip_reason(f"{head} ({why})")
    return Outcome(Retry.DEAD_LETTER, reason, "given_up", reason, error)


def with_backoff(outcome: Outcome, retry: Retry, delay_s: float | None) -> Outcome:
    """`outcome` nacked with the backoff's `retry` instead of the queue's policy."""
    return Outcome(retry, outcome.reason, outcome.label, outcome.failure, outcome.error, delay_s)
