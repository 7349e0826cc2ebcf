"""What carries jobs that lead to jobs between the clients and the workers, with nothing but
the server's own fields: the custom entries a chain step and a job whose result is awaited
carry, the idempotency keys a worker derives from a job's id for what it enqueues on the job's
behalf, and the entries of a result's reply. Pure functions; the Worker (`_worker/followups`)
and the clients (`_client/replies`, `_payloads/pipelines`) share them.

Every entry is readable where a job is seen (a dead letter, the admin UI): a chain step's
dead letter names its chain and step (`sepp.chain`, `sepp.chain.step` of `sepp.chain.steps`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .errors import ValidationError
from .types import CustomValue, EnqueueRequest, Payload

# -- a chain step's entries --------------------------------------------------------------------
CHAIN_ID = "sepp.chain"  # the chain's id: 32 hex digits, made when the chain is enqueued
CHAIN_STEP = "sepp.chain.step"  # this step's place, from 1
CHAIN_STEPS = "sepp.chain.steps"  # how many steps the chain has
CHAIN_NEXT = "sepp.chain.next"  # the steps after this one (JSON); absent on the last step

# -- a job whose result someone awaits ---------------------------------------------------------
REPLY_QUEUE = "sepp.reply.queue"  # the awaiting client's own queue
REPLY_ID = "sepp.reply.id"  # which of its waiters the result is for
REPLY_BEACON = "sepp.reply.beacon"  # the job whose lease says that client is alive
REPLY_UNTIL = "sepp.reply.until"  # ms since the epoch: no result is sent after it

# -- a reply (job type RESULT_JOB_TYPE, in the awaiting client's queue) ------------------------
RESULT_JOB_TYPE = "sepp.result"
RESULT_STATUS = "sepp.result"  # "ok" (the payload is the value) or "failed"
FAILED_JOB_ID = "sepp.failed.job_id"
FAILED_QUEUE = "sepp.failed.queue"
FAILED_JOB_TYPE = "sepp.failed.job_type"
FAILED_REASON = "sepp.failed.reason"
OK, FAILED = "ok", "failed"

# A failure's reason in a reply: a dead letter's is at most 1000 characters already.
MAX_REPLY_REASON_CHARS = 1000


# -- idempotency keys a worker derives (each at most 13 + 36 + 11 bytes: far under 256) ---------


def follow_up_key(job_id: str, index: int) -> str:
    """The key of the `index`-th follow-up (from 0) that job `job_id` asked for."""
    return f"sepp.then/{job_id}/{index}"


def chain_next_key(job_id: str) -> str:
    """The key of the chain step that job `job_id` (a step) enqueues after itself."""
    return f"sepp.chain/{job_id}"


def result_key(job_id: str) -> str:
    """The key of the reply that carries job `job_id`'s result (or its failure)."""
    return f"sepp.result/{job_id}"


# -- chains ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepSpec:
    """A chain step after the first: what a worker needs to enqueue it (its payload is the
    step before's result): the task's queue, job type and enqueue defaults."""

    queue: str
    job_type: str
    priority: int | None = None
    max_attempts: int | None = None
    custom: Mapping[str, CustomValue] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"queue": self.queue, "job_type": self.job_type}
        if self.priority is not None:
            out["priority"] = self.priority
        if self.max_attempts is not None:
            out["max_attempts"] = self.max_attempts
        if self.custom:
            out["custom"] = dict(self.custom)
        return out

    @classmethod
    def from_json(cls, value: object) -> StepSpec:
        """The step a chain entry describes; ValidationError if it is not one (another
        client's mistake, or an edited job)."""
        if not isinstance(value, dict):
            raise ValidationError(CHAIN_NEXT, f"a step must be an object, got {value!r}")
        custom = value.get("custom", {})
        request = EnqueueRequest(  # one check of every field, as an enqueue would make
            value.get("queue"),  # type: ignore[arg-type]
            value.get("job_type"),  # type: ignore[arg-type]
            priority=value.get("priority"),
            max_attempts=value.get("max_attempts"),
            custom=custom,
        )
        return cls(
            request.queue, request.job_type, request.priority, request.max_attempts, request.custom
        )


@dataclass(frozen=True, slots=True)
class ChainPosition:
    """Where a job stands in its chain: the chain's id, this step's place (from 1) of `steps`,
    and the steps after it."""

    chain_id: str
    step: int
    steps: int
    rest: tuple[StepSpec, ...]

    def entries(self) -> dict[str, CustomValue]:
        out: dict[str, CustomValue] = {
            CHAIN_ID: self.chain_id,
            CHAIN_STEP: self.step,
            CHAIN_STEPS: self.steps,
        }
        if self.rest:
            out[CHAIN_NEXT] = json.dumps(
                [spec.as_json() for spec in self.rest], separators=(",", ":"), ensure_ascii=False
            )
        return out

    def advanced(self) -> ChainPosition:
        """The position of the next step."""
        return ChainPosition(self.chain_id, self.step + 1, self.steps, self.rest[1:])

    def describe(self) -> str:
        return f"step {self.step} of {self.steps} of chain {self.chain_id}"


def chain_position(custom: Mapping[str, CustomValue]) -> ChainPosition | None:
    """The chain entries of a job's custom map; None for a job that is no chain step.
    ValidationError for entries that do not read as one."""
    chain_id = custom.get(CHAIN_ID)
    if chain_id is None:
        return None
    step, steps, rest_text = custom.get(CHAIN_STEP), custom.get(CHAIN_STEPS), custom.get(CHAIN_NEXT)
    if not isinstance(chain_id, str) or type(step) is not int or type(steps) is not int:
        raise ValidationError(CHAIN_ID, f"not the entries of a chain step: {dict(custom)!r}")
    rest: tuple[StepSpec, ...] = ()
    if rest_text is not None:
        if not isinstance(rest_text, str):
            raise ValidationError(CHAIN_NEXT, f"must be a JSON list, got {rest_text!r}")
        try:
            specs = json.loads(rest_text)
        except ValueError as exc:
            raise ValidationError(CHAIN_NEXT, f"not JSON: {exc}") from None
        if not isinstance(specs, list):
            raise ValidationError(CHAIN_NEXT, f"must be a JSON list, got {rest_text!r}")
        rest = tuple(StepSpec.from_json(spec) for spec in specs)
    return ChainPosition(chain_id, step, steps, rest)


def wants_more(custom: Mapping[str, CustomValue]) -> bool:
    """Whether a job's (non-empty) custom map makes it a chain step with a step after it, or
    a job whose result is awaited: what a worker looks at after the handler succeeded."""
    return CHAIN_NEXT in custom or REPLY_QUEUE in custom


def next_step_request(
    position: ChainPosition, payload: Payload | None, reply: ReplyAddress | None, job_id: str
) -> EnqueueRequest:
    """The request of the step after the job `job_id` at `position` (which has a next step):
    its payload is this step's result, its key derived from this job's id."""
    spec = position.rest[0]
    custom: dict[str, CustomValue] = {**spec.custom, **position.advanced().entries()}
    if reply is not None:
        custom.update(reply.entries())
    return EnqueueRequest(
        spec.queue,
        spec.job_type,
        payload=payload,
        idempotency_key=chain_next_key(job_id),
        priority=spec.priority,
        max_attempts=spec.max_attempts,
        custom=custom,
    )


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplyAddress:
    """Where a job's result goes: the awaiting client's queue, the waiter it is for, the job
    whose lease says that client is alive, and the time after which nobody waits (ms since the
    epoch)."""

    queue: str
    reply_id: str
    beacon: str
    until_ms: int

    def entries(self) -> dict[str, CustomValue]:
        return {
            REPLY_QUEUE: self.queue,
            REPLY_ID: self.reply_id,
            REPLY_BEACON: self.beacon,
            REPLY_UNTIL: self.until_ms,
        }

    def expired(self, now: datetime) -> bool:
        return epoch_ms(now) > self.until_ms


def reply_address(custom: Mapping[str, CustomValue]) -> ReplyAddress | None:
    """The reply entries of a job's custom map; None if no result is awaited (or the entries
    are not ours: a result is then not sent, which the awaiting side sees as a timeout)."""
    queue = custom.get(REPLY_QUEUE)
    if queue is None:
        return None
    reply_id, beacon, until = (
        custom.get(REPLY_ID),
        custom.get(REPLY_BEACON),
        custom.get(REPLY_UNTIL),
    )
    if (
        not isinstance(queue, str)
        or not isinstance(reply_id, str)
        or not isinstance(beacon, str)
        or type(until) is not int
    ):
        return None
    return ReplyAddress(queue, reply_id, beacon, until)


def epoch_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an awaited job will never give a result: it (or a step of its chain) was
    dead-lettered. What a reply says, and what `sepp.JobFailedError` carries."""

    job_id: str
    queue: str
    job_type: str
    reason: str
    chain_id: str | None = None
    step: int | None = None
    steps: int | None = None

    def entries(self) -> dict[str, CustomValue]:
        out: dict[str, CustomValue] = {
            FAILED_JOB_ID: self.job_id,
            FAILED_QUEUE: self.queue,
            FAILED_JOB_TYPE: self.job_type,
            FAILED_REASON: self.reason[:MAX_REPLY_REASON_CHARS],
        }
        if self.chain_id is not None:
            out[CHAIN_ID] = self.chain_id
            out[CHAIN_STEP] = self.step or 0
            out[CHAIN_STEPS] = self.steps or 0
        return out


def reply_request(
    address: ReplyAddress, job_id: str, payload: Payload | None, failure: Failure | None
) -> EnqueueRequest:
    """The reply job carrying job `job_id`'s result (`payload`) or its `failure`."""
    custom: dict[str, CustomValue] = {REPLY_ID: address.reply_id}
    if failure is None:
        custom[RESULT_STATUS] = OK
    else:
        custom[RESULT_STATUS] = FAILED
        custom.update(failure.entries())
    return EnqueueRequest(
        address.queue,
        RESULT_JOB_TYPE,
        payload=payload if failure is None else None,
        idempotency_key=result_key(job_id),
        custom=custom,
    )


def read_failure(custom: Mapping[str, CustomValue]) -> Failure:
    """The failure a reply reports (fields it lacks read as empty)."""

    def text(key: str) -> str:
        value = custom.get(key)
        return value if isinstance(value, str) else ""

    def number(key: str) -> int | None:
        value = custom.get(key)
        return value if type(value) is int else None

    chain_id = custom.get(CHAIN_ID)
    return Failure(
        text(FAILED_JOB_ID),
        text(FAILED_QUEUE),
        text(FAILED_JOB_TYPE),
        text(FAILED_REASON),
        chain_id if isinstance(chain_id, str) else None,
        number(CHAIN_STEP),
        number(CHAIN_STEPS),
    )


MAX_RESULT_TTL_S = 86_400.0
DEFAULT_RESULT_TTL_S = 600.0
