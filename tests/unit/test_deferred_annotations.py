"""Handlers and lifespans whose annotations cannot be resolved when they are registered, in a
module WITHOUT `from __future__ import annotations` (every other test module has it).

From Python 3.14 (PEP 649/749) annotations written as code are evaluated when asked for, not
when the function is defined: a model imported only under TYPE_CHECKING, or a class defined
after the decorator that registers the handler, raises NameError when the registration looks at
the signature. The cases marked `deferred` only exist there (before 3.14 the `def` itself
raises NameError); the others run on every Python and pin the same behaviour for annotations
written as strings.
"""

import dataclasses
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
import trio
from fixtures.fake_client import FakeClient
from trio.testing import MockClock

import sepp
from sepp.testing import job_context

if TYPE_CHECKING:  # only for the checker: the annotations below cannot be resolved at run time
    from decimal import Decimal

deferred = pytest.mark.skipif(
    sys.version_info < (3, 14),
    reason="before 3.14 an annotation is evaluated when the function is defined (PEP 649)",
)


@dataclasses.dataclass(frozen=True)
class Order:
    sku: str


order_task = sepp.Task("q", "order", Order)


def test_this_module_defers_its_annotations_as_python_does() -> None:
    # The point of this module: no `from __future__ import annotations`.
    assert "annotations" not in globals()

    def handle(job: Order, ctx: sepp.JobContext) -> None: ...

    assert handle.__annotations__["job"] is Order


# -- a plain handler: TypeError with advice ---------------------------------------------------


@deferred
def test_a_model_imported_only_for_the_checker_is_refused_with_advice() -> None:
    async def handle(job: Decimal, ctx: sepp.JobContext) -> None: ...

    for register in (sepp.Router().handle, sepp.Worker(FakeClient(), "q").handle):
        with pytest.raises(
            TypeError, match=r"cannot resolve the annotation 'Decimal'.*Router.task"
        ):
            register("t", handle)


@deferred
def test_a_handler_registered_before_its_model_is_defined_is_refused_with_advice() -> None:
    router = sepp.Router()
    with pytest.raises(TypeError, match=r"cannot resolve the annotation 'Later'.*Router.task"):

        @router.handler("t")
        async def handle(job: Later, ctx: sepp.JobContext) -> None: ...  # noqa: F821

    @dataclasses.dataclass
    class Later:
        sku: str


def test_a_string_annotation_that_does_not_resolve_is_refused_with_advice() -> None:
    async def handle(job: "Missing", ctx: sepp.JobContext) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(TypeError, match=r"cannot resolve the annotation 'Missing'.*Router.task"):
        sepp.Router().handle("t", handle)


@deferred
def test_an_unresolvable_annotation_elsewhere_still_lets_a_raw_handler_register() -> None:
    async def handle(payload: sepp.Payload | None, ctx: Decimal) -> None: ...

    assert sepp.Router().handle("t", handle).lookup("t") is handle


async def test_resolved_annotations_decode_without_the_future_import() -> None:
    seen: list[object] = []

    async def handle(job: Order, ctx: sepp.JobContext) -> None:
        seen.append(job)

    handler = sepp.Router().handle("t", handle).lookup("t")
    assert handler is not None and handler is not handle
    await handler(sepp.Payload.json({"sku": "mug"}), job_context("t"))
    assert seen == [Order("mug")]


# -- a task handler: matched with the task's type by name -------------------------------------


async def _decodes_through(register: Any, handle: Any, seen: list[object]) -> None:
    router = sepp.Router()
    register(router)(handle)
    handler = router.lookup("order")
    assert handler is not None
    await handler(sepp.Payload.json({"sku": "mug"}), job_context("order"))
    assert seen == [Order("mug")]


@deferred
async def test_a_task_handler_registered_before_a_class_of_its_types_name_is_matched_by_name() -> (
    None
):
    seen: list[object] = []

    async def handle(job: Order, ctx: sepp.JobContext) -> None:  # the local Order below
        seen.append(job)

    await _decodes_through(lambda router: router.task(order_task), handle, seen)

    class Order:  # a local name: the module's Order is out of reach in this function
        pass


async def test_a_task_handler_with_a_string_annotation_of_its_types_name_is_matched() -> None:
    seen: list[object] = []

    async def handle(job: "shop.Order", ctx: "Missing") -> None:  # type: ignore[name-defined]  # noqa: F821
        seen.append(job)

    await _decodes_through(lambda router: router.task(order_task), handle, seen)


@deferred
def test_a_task_handler_annotated_with_another_unresolvable_type_is_refused_by_name() -> None:
    async def handle(job: Decimal, ctx: sepp.JobContext) -> None: ...

    for register in (
        sepp.Router().task(order_task),
        sepp.Worker(FakeClient(), "q").task(order_task),
    ):
        with pytest.raises(
            TypeError, match=r"annotated 'Decimal', but the task's payloads are Order"
        ):
            register(handle)


# -- a lifespan: only its parameters are looked at --------------------------------------------


async def _run_with(lifespan: Any) -> list[str]:
    """What `lifespan` saw in a worker that starts, runs one job and stops (on MockClock)."""
    fake = FakeClient()
    worker = sepp.Worker(fake, "q", lifespan=lifespan, _wall_clock=fake.now)
    done = trio.Event()

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        done.set()

    fake.add("work")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await done.wait()
        worker.shutdown()
    return lifespan.events  # type: ignore[no-any-return]


@deferred
async def test_a_lifespan_with_a_state_type_imported_only_for_the_checker_is_given_the_worker(
    autojump_clock: MockClock,
) -> None:
    @asynccontextmanager
    async def lifespan(worker: sepp.Worker) -> AsyncIterator[Decimal]:
        lifespan.events.append(f"worker={type(worker).__name__}")  # type: ignore[attr-defined]
        yield None  # type: ignore[misc]

    lifespan.events = []  # type: ignore[attr-defined]
    assert sepp.Router(lifespan=lifespan) is not None
    assert await _run_with(lifespan) == ["worker=Worker"]


@deferred
async def test_a_lifespan_registered_before_its_state_type_is_defined_is_called_without_the_worker(
    autojump_clock: MockClock,
) -> None:
    @asynccontextmanager
    async def lifespan() -> AsyncIterator[State]:  # noqa: F821
        lifespan.events.append("entered")  # type: ignore[attr-defined]
        yield State()

    lifespan.events = []  # type: ignore[attr-defined]
    assert sepp.Router(lifespan=lifespan) is not None

    class State:
        pass

    assert await _run_with(lifespan) == ["entered"]


async def test_a_lifespan_with_string_annotations_that_do_not_resolve_is_given_the_worker(
    autojump_clock: MockClock,
) -> None:
    @asynccontextmanager
    async def lifespan(worker: "Missing") -> "AsyncIterator[Missing]":  # type: ignore[name-defined]  # noqa: F821
        lifespan.events.append("entered")  # type: ignore[attr-defined]
        yield None

    lifespan.events = []  # type: ignore[attr-defined]
    assert await _run_with(lifespan) == ["entered"]


def test_a_lifespan_that_cannot_be_called_either_way_is_still_refused() -> None:
    @asynccontextmanager
    async def lifespan(worker: "Missing", other: "Missing") -> AsyncIterator[None]:  # type: ignore[name-defined]  # noqa: F821
        yield

    with pytest.raises(TypeError, match=r"cannot be called as lifespan\(worker\) or lifespan\(\)"):
        sepp.Router(lifespan=lifespan)
