"""After a handler succeeded, before its job is acked: what the job leads to. The follow-ups
its handler asked for (`ctx.then`) and, for a chain step, the next step (its payload: this
step's result) are enqueued in one atomic enqueue, each under an idempotency key made from
this job's id, so a redelivery of the job (its ack lost, its worker killed) finds them there
and enqueues nothing twice within the server's dedup window. Then the result goes to the
client awaiting it, if one does and is still alive. And when a job whose result is awaited is
about to be dead-lettered, the failure goes there instead.

The Worker calls in only for jobs that asked for any of this (a follow-up recorded, or a
custom entry of `_model/pipelines`): the others pass by with an attribute read and an empty
custom map's truth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

from .._client.calls import JobsClient
from .._client.chunking import DEFAULT_MAX_ENQUEUE_BATCH
from .._client.replies import probe_beacon
from .._model import pipelines as p
from .._model.deferred import origin_id
from .._model.errors import BatchValidationError, SeppError, ValidationError
from .._model.settlement import HandlerError, Outcome, describe
from .._model.types import EnqueueRequest, JobContext, Payload
from .._runtime.wall_clock import utc_now
from .._util.log import Log

EncodeResult = Callable[[Any], Payload | None]


def default_encode_result(value: object) -> Payload | None:
    """A result of a handler registered without a task: None as no payload, a Payload as it
    is, anything else as JSON (the default codec's)."""
    if value is None or isinstance(value, Payload):
        return value
    from .._payloads.codecs import JsonCodec

    return JsonCodec().encode(value)


class FollowUps:
    """The Worker's sender of what succeeded jobs lead to, over its client."""

    def __init__(self, client: object, log: Log) -> None:
        self._client = cast("JobsClient", client)
        self._log = log

    async def succeeded(self, ctx: JobContext, returned: object, encode: EncodeResult) -> None:
        """Enqueue what job `ctx`, whose handler returned `returned`, leads to, and send its
        result to whoever awaits it. Raises HandlerError when the job must not be acked: for a
        retry (the server could not take the follow-ups now) or for good (they can never be
        enqueued, or the result cannot be encoded)."""
        custom = ctx.custom
        try:
            position = p.chain_position(custom) if custom else None
        except ValidationError as exc:
            raise HandlerError.permanent(f"the job's chain entries do not read: {exc}") from None
        address = p.reply_address(custom) if custom else None
        payload: Payload | None = None
        if (position is not None and position.rest) or address is not None:
            try:
                payload = encode(returned)
            except SeppError as exc:  # ValidationError: not the task's result type
                raise HandlerError.permanent(
                    f"the handler's result cannot be sent: {describe(exc)}"
                ) from None
        job_id = origin_id(custom, ctx.id)  # one key across a limit's deferred copies
        requests = [
            request
            if request.idempotency_key is not None
            else dataclasses.replace(request, idempotency_key=p.follow_up_key(job_id, index))
            for index, request in enumerate(ctx._lease.follow_ups or ())
        ]
        if position is not None and position.rest:
            requests.append(p.next_step_request(position, payload, address, job_id))
            address = None  # the last step sends the result
        if requests:
            await self._enqueue(requests)
        if address is not None:
            await self._reply(ctx, address, payload, None)

    async def dead_lettered(self, ctx: JobContext, outcome: Outcome) -> None:
        """Job `ctx` was nacked into the dead letters as `outcome` says: tell the client that
        awaits its result (or its chain's) why. (Told after the nack, so the dead letter is
        there when it hears; a worker gone in between leaves it to its timeout.)"""
        custom = ctx.custom
        address = p.reply_address(custom)
        if address is None:
            return
        try:
            position = p.chain_position(custom)
        except ValidationError:
            position = None
        failure = p.Failure(
            ctx.id,
            ctx.queue,
            ctx.job_type,
            outcome.reason or outcome.label,
            None if position is None else position.chain_id,
            None if position is None else position.step,
            None if position is None else position.steps,
        )
        await self._reply(ctx, address, None, failure)

    async def _enqueue(self, requests: list[EnqueueRequest]) -> None:
        client = self._client
        if getattr(client, "enqueue_atomic", None) is None:
            raise HandlerError.permanent(
                "this worker's client cannot enqueue the job's follow-ups (no enqueue_atomic)"
            )
        most = _max_batch(client)
        for start in range(0, len(requests), most):
            chunk = requests[start : start + most]
            try:
                await client.enqueue_atomic(chunk)
            except BatchValidationError as exc:
                raise _refused(exc, chunk, start) from None
            except SeppError as exc:  # not sent, or unknown: the keys make a retry safe
                raise HandlerError.retry(
                    f"its follow-ups could not be enqueued ({describe(exc)}); retried, and any"
                    " already enqueued are not enqueued again"
                ) from None

    async def _reply(
        self,
        ctx: JobContext,
        address: p.ReplyAddress,
        payload: Payload | None,
        failure: p.Failure | None,
    ) -> None:
        """Best effort: a result nobody can take is not sent, and one that cannot be sent is
        logged, the job acked (or nacked) as it would be; its awaiter's wait ends at its
        deadline."""
        if address.expired(utc_now()):
            return  # the awaiting handle has given up
        client = self._client
        if await probe_beacon(client, address.beacon) is False:
            return  # its client went away
        try:
            job_id = origin_id(ctx.custom, ctx.id)
            await client.enqueue(p.reply_request(address, job_id, payload, failure))
        except SeppError as exc:
            self._log.warning(
                "sepp: the result of %s could not be sent to %s: %s", ctx, address.queue, exc
            )


def _max_batch(client: object) -> int:
    limit = getattr(client, "_max_enqueue_batch", None)
    most = limit() if callable(limit) else DEFAULT_MAX_ENQUEUE_BATCH
    return most if isinstance(most, int) and most > 0 else DEFAULT_MAX_ENQUEUE_BATCH


def _refused(exc: BatchValidationError, chunk: list[EnqueueRequest], start: int) -> HandlerError:
    """The HandlerError of follow-ups the server refused: retried if every refusal may pass
    (a full or closing queue), else for good (the same follow-ups would be refused again)."""
    from .._model.rejection_reasons import describe_job_rejection

    parts = []
    for error in exc.errors[:3]:
        request = chunk[error.index]
        parts.append(
            f"#{start + error.index} ({request.job_type} on {request.queue}):"
            f" {describe_job_rejection(error.rejection)}"
        )
    more = f" (+{len(exc.errors) - 3} more)" if len(exc.errors) > 3 else ""
    text = "; ".join(parts) + more
    if all(error.rejection.retryable for error in exc.errors):
        return HandlerError.retry(f"its follow-ups were refused for now: {text}")
    return HandlerError.permanent(f"its follow-ups were refused: {text}")
