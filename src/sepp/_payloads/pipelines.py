"""Chains and groups of typed tasks: `sepp.chain(resize.job(image), upload, notify)`, whose
steps each take the step before's result, and `sepp.group(...)`, jobs enqueued atomically
together. Both are enqueued in one call, awaited through a handle, or made follow-ups of a job
(`ctx.then`); a worker moves a chain from step to step (`_worker/followups`)."""

from __future__ import annotations

import uuid
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .._client.client_kind import either_client
from .._model import pipelines as p
from .._model.errors import ValidationError
from .._model.types import EnqueueAck, EnqueueRequest
from .handles import SINGLE, Decode, OneJob, Submission, Submittable
from .task import Task, TaskJob

if TYPE_CHECKING:
    from .._client.client import Client
    from .._client.sync import SyncClient

R = TypeVar("R")
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
D = TypeVar("D")
E = TypeVar("E")
F = TypeVar("F")
G = TypeVar("G")


class Chain(OneJob[R]):
    """Jobs run one after the other, each step's handler given the step before's return value
    as its payload: `sepp.chain(resize.job(image), upload, notify)`; `R` is the last step's
    result. Enqueueing it enqueues its first step, which carries the rest (custom entries:
    `sepp.chain` names the chain, `sepp.chain.step` of `sepp.chain.steps` the step); each
    worker enqueues the next step before it acks its own, under a key made from its job's id,
    so a redelivered step does not start the next one twice. A step that fails for good (it is
    dead-lettered) stops the chain there; its dead letter says which chain and step it was,
    and a `submit`ted chain's handle raises `sepp.JobFailedError` naming them."""

    __slots__ = ("_first", "_rest")

    def __init__(self, first: TaskJob[Any, Any], rest: Sequence[Task[Any, Any]]) -> None:
        if not isinstance(first, TaskJob):
            raise TypeError(
                "a chain's first step is a job with its payload: task.job(payload), not"
                f" {type(first).__name__}"
            )
        if not rest:
            raise ValidationError("steps", "a chain has at least two steps")
        for index, step in enumerate(rest, start=2):
            if not isinstance(step, Task):
                raise TypeError(
                    f"step {index} of a chain is a sepp.Task (its payload is the step before's"
                    f" result), not {type(step).__name__}: a group as a step, a chord, would"
                    " need a join that waits for every member (see the docs, 'Jobs that lead"
                    " to jobs')"
                )
        self._first = first
        self._rest = tuple(rest)

    @property
    def tasks(self) -> tuple[Task[Any, Any], ...]:
        """The chain's tasks, first to last."""
        return (self._first.task, *self._rest)

    @property
    def last(self) -> Task[Any, R]:
        """The chain's last task, whose result the chain's is."""
        return self._rest[-1]

    def _enqueue_requests(self) -> list[EnqueueRequest]:
        # A chain id per enqueue: the same Chain enqueued twice is two chains.
        request = self._first.request
        position = p.ChainPosition(
            uuid.uuid4().hex, 1, 1 + len(self._rest), tuple(task._step() for task in self._rest)
        )
        return [
            EnqueueRequest(
                request.queue,
                request.job_type,
                payload=request.payload,
                idempotency_key=request.idempotency_key,
                priority=request.priority,
                max_attempts=request.max_attempts,
                custom={**request.custom, **position.entries()},
                scheduled_at=request.scheduled_at,
                trace_context=request.trace_context,
            )
        ]

    def _submission(self) -> Submission:
        # `result_ttl` covers the whole chain: the last step sends the result.
        return Submission(self._enqueue_requests(), [self.last.decode_result], SINGLE)

    def __repr__(self) -> str:
        names = " -> ".join(task.job_type for task in self.tasks)
        return f"<sepp.Chain {names}>"


class Group(Submittable[R]):
    """Jobs enqueued atomically together, all or none: `sepp.group(resize.job(a),
    resize.job(b))`; its members are task jobs or chains (their first steps). `R` is the tuple
    of the members' results, in order. A group is no barrier: its members run as any jobs do,
    in parallel; `submit` gives a handle whose `result()` waits for all of them."""

    __slots__ = ("_members",)

    def __init__(self, members: Sequence[TaskJob[Any, Any] | Chain[Any]]) -> None:
        if not members:
            raise ValidationError("members", "a group has at least one member")
        for index, member in enumerate(members):
            if not isinstance(member, TaskJob | Chain):
                raise TypeError(
                    f"member {index} of a group is a task.job(payload) or a sepp.chain(...),"
                    f" not {type(member).__name__}"
                )
        self._members = tuple(members)

    @property
    def members(self) -> tuple[TaskJob[Any, Any] | Chain[Any], ...]:
        """The group's members, in order."""
        return self._members

    def _enqueue_requests(self) -> list[EnqueueRequest]:
        return [request for member in self._members for request in member._enqueue_requests()]

    @overload
    def enqueue(
        self, client: SyncClient, *, timeout: float | timedelta | None = None
    ) -> list[EnqueueAck]: ...

    @overload
    def enqueue(
        self, client: Client, *, timeout: float | timedelta | None = None
    ) -> Coroutine[Any, Any, list[EnqueueAck]]: ...

    def enqueue(
        self, client: Client | SyncClient, *, timeout: float | timedelta | None = None
    ) -> list[EnqueueAck] | Coroutine[Any, Any, list[EnqueueAck]]:
        """Enqueue every member in one atomic enqueue (await it with a `sepp.Client`):
        all are enqueued, or `sepp.BatchValidationError` says which were refused and none is."""
        requests = self._enqueue_requests()
        return either_client(client, "Group.enqueue").enqueue_atomic(requests, timeout=timeout)

    def _submission(self) -> Submission:
        # The first member found failed fails the group's result (JobFailedError).
        decoders: list[Decode] = [
            member.last.decode_result if isinstance(member, Chain) else member.task.decode_result
            for member in self._members
        ]
        return Submission(self._enqueue_requests(), decoders, tuple, atomic=True)

    def __repr__(self) -> str:
        return f"<sepp.Group of {len(self._members)}>"


# -- the typed constructors ---------------------------------------------------------------------


@overload
def chain(first: TaskJob[Any, A], second: Task[A, B], /) -> Chain[B]: ...
@overload
def chain(first: TaskJob[Any, A], second: Task[A, B], third: Task[B, C], /) -> Chain[C]: ...
@overload
def chain(
    first: TaskJob[Any, A], second: Task[A, B], third: Task[B, C], fourth: Task[C, D], /
) -> Chain[D]: ...
@overload
def chain(
    first: TaskJob[Any, A],
    second: Task[A, B],
    third: Task[B, C],
    fourth: Task[C, D],
    fifth: Task[D, E],
    /,
) -> Chain[E]: ...
@overload
def chain(
    first: TaskJob[Any, A],
    second: Task[A, B],
    third: Task[B, C],
    fourth: Task[C, D],
    fifth: Task[D, E],
    sixth: Task[E, F],
    /,
) -> Chain[F]: ...
@overload
def chain(
    first: TaskJob[Any, Any],
    second: Task[Any, Any],
    third: Task[Any, Any],
    fourth: Task[Any, Any],
    fifth: Task[Any, Any],
    sixth: Task[Any, Any],
    seventh: Task[Any, Any],
    /,
    *more: Task[Any, Any],
) -> Chain[Any]: ...  # seven steps or more: their types are checked as they run


def chain(first: TaskJob[Any, Any], /, *steps: Task[Any, Any]) -> Chain[Any]:
    """Steps run one after the other, each given the one before's result:
    `sepp.chain(resize.job(image), upload, notify)` (see `sepp.Chain`). The first step is a
    job (`task.job(payload)`); each later one a `sepp.Task` whose payload type is the result
    type of the task before it, which mypy checks for chains of up to six steps."""
    return Chain(first, steps)


@overload
def group(first: TaskJob[Any, A] | Chain[A], /) -> Group[tuple[A]]: ...
@overload
def group(
    first: TaskJob[Any, A] | Chain[A], second: TaskJob[Any, B] | Chain[B], /
) -> Group[tuple[A, B]]: ...
@overload
def group(
    first: TaskJob[Any, A] | Chain[A],
    second: TaskJob[Any, B] | Chain[B],
    third: TaskJob[Any, C] | Chain[C],
    /,
) -> Group[tuple[A, B, C]]: ...
@overload
def group(
    first: TaskJob[Any, A] | Chain[A],
    second: TaskJob[Any, B] | Chain[B],
    third: TaskJob[Any, C] | Chain[C],
    fourth: TaskJob[Any, D] | Chain[D],
    /,
) -> Group[tuple[A, B, C, D]]: ...
@overload
def group(
    *members: TaskJob[Any, G] | Chain[G],
) -> Group[tuple[G, ...]]: ...


def group(*members: TaskJob[Any, Any] | Chain[Any]) -> Group[Any]:
    """Jobs enqueued atomically together (see `sepp.Group`): `sepp.group(resize.job(a),
    resize.job(b))`, or `sepp.group(*(resize.job(i) for i in images))`. Its result is the
    tuple of its members' results, typed member by member for up to four."""
    return Group(members)
