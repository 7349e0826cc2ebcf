"""A job's coroutine driven step by step by the task that runs it (a job runner, which runs
one job after another), each step in the job's own `contextvars.Context`, as if the job had a
task of its own: what the handler and its middleware set there stays with the job. Each step
is also stamped for the loop watch, if there is one.

A job whose run was cancelled (shutdown, lease lost) asks its runner to leave the cancel scope
it runs jobs in before it settles (`leave_runner_scope`): the runner's scope is cancelled, so
nothing could be awaited inside it any more."""

from __future__ import annotations

import types
from collections.abc import Coroutine, Generator
from time import monotonic
from typing import TYPE_CHECKING, Any

from .held_job import HeldJob, Phase

if TYPE_CHECKING:
    from .lease_keeper import LeaseKeeper
    from .loop_watch import LoopWatch

JobCoroutine = Coroutine[Any, Any, None]


class _LeaveRunnerScope:
    """What a job yields to its runner (never to the event loop) to be resumed outside the
    runner's cancel scope."""

    __slots__ = ()


LEAVE = _LeaveRunnerScope()
_RUNNING = Phase.RUNNING  # a global, not an attribute of one, read each step


@types.coroutine
def leave_runner_scope() -> Generator[Any, Any, None]:
    """In a job driven by `drive`: return once its runner has left its cancelled scope."""
    yield LEAVE


@types.coroutine
def drive(
    held: HeldJob,
    job: JobCoroutine,
    watch: LoopWatch | None,
    leases: LeaseKeeper | None,
) -> Generator[Any, Any, JobCoroutine | None]:
    """Await `job`, the run of `held`, with each step run in the job's context (and stamped
    on `watch`): None once it has returned, or `job` itself, suspended, when it asked to
    leave the runner's scope (resume it with another `drive` once out of it). When its
    handler first waits, `leases` starts keeping its lease (in `held.lease_context`): a
    handler that returns without waiting (most) needs no keeping, as nothing else runs
    meanwhile.

    A generator, not a coroutine function: what the event loop sends or throws in goes
    straight to the job, and nothing but the job's own steps runs in its context."""
    context = held.context
    assert context is not None
    ctx = held.job.ctx
    run = context.run
    send, throw = job.send, job.throw
    value: Any = None
    error: BaseException | None = None
    while True:
        if watch is not None:
            watch.current = (ctx, monotonic())
        try:
            yielded = run(send, value) if error is None else run(throw, error)
        except StopIteration:
            return None
        finally:
            if watch is not None:
                watch.current = None
        if yielded is LEAVE:
            return job
        if held.phase is _RUNNING and held.watch_key < 0 and leases is not None:
            leases.watch(held, None, held.lease_context)
        error = None
        try:
            value = yield yielded
        except GeneratorExit:
            run(job.close)
            raise
        except BaseException as exc:  # a cancellation, say: the job's to handle
            value, error = None, exc
