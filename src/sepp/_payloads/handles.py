"""Result handles: what `submit` returns for a task's job, a chain or a group, and the one
submission that makes them (written once: a `SyncClient`'s runs it under `run_blocking`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar, overload

from .._client.calls import JobsClient
from .._client.client_kind import either_client
from .._client.replies import Replies, Reply, Waiter
from .._model import pipelines as p
from .._model import validate as v
from .._model.errors import (
    JobFailedError,
    ResultTimeoutError,
    ResultUnavailableError,
    ValidationError,
)
from .._model.types import EnqueueAck, EnqueueRequest, Payload
from .._runtime.blocking_runtime import run_blocking

if TYPE_CHECKING:
    from .._client.client import Client
    from .._client.sync import SyncClient

R = TypeVar("R")

Decode = Callable[[Payload | None], Any]
Combine = Callable[[list[Any]], Any]


def _single(values: list[Any]) -> Any:
    return values[0]


class _Results:
    """The results one submission awaits (one, or a group's), read in order."""

    __slots__ = ("_decoders", "_replies", "_values", "_waiters", "combine", "job_ids")

    def __init__(
        self,
        replies: Replies,
        waiters: list[Waiter],
        decoders: Sequence[Decode],
        combine: Combine,
        job_ids: tuple[str, ...],
    ) -> None:
        self._replies = replies
        self._waiters = waiters
        self._decoders = list(decoders)
        self.combine = combine
        self.job_ids = job_ids
        self._values: list[Any] | None = None

    async def result(self, timeout: float | timedelta | None) -> Any:
        if self._values is not None:
            return self.combine(self._values)
        timeout_s = None if timeout is None else v.seconds("timeout", timeout, allow_zero=True)
        rt = self._replies._rt
        until = None if timeout_s is None else rt.current_time() + timeout_s
        replies: list[Reply] = []
        for waiter in self._waiters:
            # A member that failed already fails the group now, whatever its place.
            failed = [
                w for w in self._waiters if isinstance(w.outcome, Reply) and w.outcome.failure
            ]
            if failed:
                raise _job_failed(failed[0].outcome)  # type: ignore[arg-type]
            left = None if until is None else max(0.0, until - rt.current_time())
            try:
                reply = await self._replies.wait(waiter, left)
            except ResultTimeoutError:
                raise ResultTimeoutError(
                    f"no result within {timeout_s:g}s for {self._describe()} (it may still"
                    " come: call result() again)"
                ) from None
            if reply.failure is not None:
                raise _job_failed(reply)
            replies.append(reply)
        values = [
            decode(reply.payload) for decode, reply in zip(self._decoders, replies, strict=True)
        ]
        self._values = values
        return self.combine(values)

    def forget(self) -> None:
        for waiter in self._waiters:
            self._replies.forget(waiter)

    def _describe(self) -> str:
        return f"job {self.job_ids[0]}" if len(self.job_ids) == 1 else f"{len(self.job_ids)} jobs"


def _job_failed(reply: Reply) -> JobFailedError:
    failure = reply.failure
    assert failure is not None
    return JobFailedError(
        job_id=failure.job_id,
        queue=failure.queue,
        job_type=failure.job_type,
        reason=failure.reason,
        chain_id=failure.chain_id,
        step=failure.step,
        steps=failure.steps,
    )


class _Handle(Generic[R]):
    """What both handles have: the acks, and the results they wait for."""

    __slots__ = ("_results", "acks")

    def __init__(self, results: _Results, acks: tuple[EnqueueAck, ...]) -> None:
        self._results = results
        self.acks = acks

    @property
    def job_id(self) -> str:
        """The id of the job enqueued (a chain's first step, a group's first member)."""
        return self.acks[0].job_id

    @property
    def deduplicated(self) -> bool:
        """Whether the enqueue was deduplicated (by an idempotency key): the result then goes
        to whoever enqueued the job first, and `result()` raises ResultUnavailableError."""
        return any(ack.deduplicated for ack in self.acks)

    def forget(self) -> None:
        """Stop waiting: a result that arrives later is dropped (what dropping the handle
        does, when it is collected)."""
        self._results.forget()

    def __repr__(self) -> str:
        return f"<sepp.{type(self).__name__} {self._results._describe()}>"


class ResultHandle(_Handle[R]):
    """A job (a task's, a chain's, a group's) whose result this client awaits: from
    `await task.submit(client, payload)`, `await chain.submit(client)` or
    `await group.submit(client)`.

    `await handle.result(timeout=...)` returns the handler's return value (a chain's: its last
    step's; a group's: a tuple, in the group's order), decoded into the task's `result` type.
    It raises `sepp.JobFailedError` if the job (or a step, or a member) was dead-lettered,
    `sepp.ResultTimeoutError` if no result came within `timeout` (call it again: it may still
    come), and `sepp.ResultUnavailableError` once none can come (the handle's `result_ttl`
    passed, the enqueue was deduplicated, the client closed). Without a `timeout` it waits
    until the `result_ttl`. The result, once read, is kept: later calls return it at once.
    Dropping the handle (or `forget()`) stops the wait: a result arriving later is dropped.
    `job_id`, `deduplicated` and `acks` say what was enqueued.
    """

    __slots__ = ()

    async def result(self, *, timeout: float | timedelta | None = None) -> R:
        """The result (see the class): seconds or a timedelta to wait; None until the
        handle's `result_ttl`."""
        return await self._results.result(timeout)  # type: ignore[no-any-return]


class SyncResultHandle(_Handle[R]):
    """`sepp.ResultHandle` for blocking code, from `task.submit(sync_client, payload)` (and
    a chain's, a group's): `handle.result(timeout=...)` blocks until the result is there,
    with the same results and errors."""

    __slots__ = ()

    def result(self, *, timeout: float | timedelta | None = None) -> R:
        """The result (see `sepp.ResultHandle.result`), blocking for it."""
        return run_blocking(self._results.result(timeout))  # type: ignore[no-any-return]


# -- what can be submitted ------------------------------------------------------------------


class Submission(NamedTuple):
    """What `submit` sends and how it reads the results: the requests, a decoder per awaited
    result, how the decoded values combine, and whether the requests go atomically."""

    requests: list[EnqueueRequest]
    decoders: list[Decode]
    combine: Combine
    atomic: bool = False


class Submittable(Generic[R]):
    """A job, chain or group that `submit` enqueues with a handle on its result `R`."""

    __slots__ = ()

    def _submission(self) -> Submission:
        raise NotImplementedError

    @overload
    def submit(
        self, client: SyncClient, *, result_ttl: float | timedelta = p.DEFAULT_RESULT_TTL_S
    ) -> SyncResultHandle[R]: ...

    @overload
    def submit(
        self, client: Client, *, result_ttl: float | timedelta = p.DEFAULT_RESULT_TTL_S
    ) -> Coroutine[Any, Any, ResultHandle[R]]: ...

    def submit(
        self, client: Client | SyncClient, *, result_ttl: float | timedelta = p.DEFAULT_RESULT_TTL_S
    ) -> ResultHandle[R] | SyncResultHandle[R] | Coroutine[Any, Any, ResultHandle[R]]:
        """Enqueue it and return a handle on its result (a coroutine of one with a
        `sepp.Client`, the handle itself with a `sepp.SyncClient`): see `sepp.ResultHandle`.
        A worker sends no result after `result_ttl` (seconds or timedelta, at most a day),
        when the handle's `result()` gives up."""
        from .._client.sync import SyncClient

        what = f"{type(self).__name__}.submit"
        submission = self._submission()
        checked = either_client(client, what)
        if isinstance(checked, SyncClient):
            return submit_blocking(checked, submission, result_ttl)
        return submit_async(checked, submission, result_ttl)


class OneJob(Submittable[R]):
    """A job, or a chain (its first step): one request, enqueued alone."""

    __slots__ = ()

    def _enqueue_requests(self) -> list[EnqueueRequest]:
        raise NotImplementedError

    @overload
    def enqueue(
        self, client: SyncClient, *, timeout: float | timedelta | None = None
    ) -> EnqueueAck: ...

    @overload
    def enqueue(
        self, client: Client, *, timeout: float | timedelta | None = None
    ) -> Coroutine[Any, Any, EnqueueAck]: ...

    def enqueue(
        self, client: Client | SyncClient, *, timeout: float | timedelta | None = None
    ) -> EnqueueAck | Coroutine[Any, Any, EnqueueAck]:
        """Enqueue it through `client` (await it with a `sepp.Client`): a chain's ack is its
        first step's."""
        (request,) = self._enqueue_requests()
        what = f"{type(self).__name__}.enqueue"
        return either_client(client, what).enqueue(request, timeout=timeout)


# -- submitting ---------------------------------------------------------------------------------


def checked_ttl(result_ttl: float | timedelta) -> float:
    seconds = v.seconds("result_ttl", result_ttl)
    if seconds > p.MAX_RESULT_TTL_S:
        raise ValidationError(
            "result_ttl", f"must be at most {p.MAX_RESULT_TTL_S:g}s (a day), got {seconds:g}s"
        )
    return seconds


async def submit(
    calls: JobsClient, replies: Replies, submission: Submission, ttl_s: float
) -> tuple[_Results, tuple[EnqueueAck, ...]]:
    """Enqueue the submission's requests, each carrying the address of a new waiter of
    `replies` (one request alone, or atomically together)."""
    requests = submission.requests
    waiters = [replies.expect(ttl_s) for _ in requests]
    stamped = [
        dataclasses.replace(
            request, custom={**request.custom, **replies.address(waiter, ttl_s).entries()}
        )
        for request, waiter in zip(requests, waiters, strict=True)
    ]
    try:
        if submission.atomic or len(stamped) != 1:
            acks = tuple(await calls.enqueue_atomic(stamped))
        else:
            acks = (await calls.enqueue(stamped[0]),)
    except BaseException:
        for waiter in waiters:
            replies.forget(waiter)
        raise
    for ack, waiter in zip(acks, waiters, strict=True):
        if ack.deduplicated:
            replies.forget(waiter)
            waiter.settle(
                ResultUnavailableError(
                    f"the enqueue of job {ack.job_id} was deduplicated (its idempotency key was"
                    " used before): its result goes to whoever enqueued it first"
                )
            )
    job_ids = tuple(ack.job_id for ack in acks)
    results = _Results(replies, waiters, submission.decoders, submission.combine, job_ids)
    return results, acks


async def submit_async(
    client: Client, submission: Submission, result_ttl: float | timedelta
) -> ResultHandle[Any]:
    ttl_s = checked_ttl(result_ttl)
    replies = await client._awaiting_results()
    results, acks = await submit(client, replies, submission, ttl_s)
    return ResultHandle(results, acks)


def submit_blocking(
    client: SyncClient, submission: Submission, result_ttl: float | timedelta
) -> SyncResultHandle[Any]:
    from .._client.sync import BlockingCalls

    ttl_s = checked_ttl(result_ttl)
    replies = client._awaiting_results()
    results, acks = run_blocking(submit(BlockingCalls(client), replies, submission, ttl_s))
    return SyncResultHandle(results, acks)


SINGLE: Combine = _single
