"""sepp.Router: registration without a client, composition, and a Worker built from one."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from fixtures.fake_client import FakeClient, RecordingLogger
from trio.testing import MockClock

import sepp


async def noop(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
    pass


async def other(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
    pass


def test_registration_forms_chain_and_keep_order() -> None:
    router = sepp.Router()

    @router.handler("b")
    async def b(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        pass

    assert router.handle("a", noop).handle("c", other) is router
    assert router.catch_all(other) is other  # returns the function: usable as a decorator
    assert router.job_types == ("b", "a", "c")
    assert router.has_catch_all
    assert repr(router) == "<sepp.Router ['b', 'a', 'c'] +catch_all>"


def test_a_type_registered_twice_raises_duplicate_handler_error() -> None:
    router = sepp.Router().handle("a", noop)
    with pytest.raises(sepp.DuplicateHandlerError) as info:
        router.handle("a", other)
    assert info.value.job_type == "a"
    with pytest.raises(sepp.DuplicateHandlerError):
        router.handler("a")(other)
    router.catch_all(noop)
    with pytest.raises(sepp.DuplicateHandlerError) as info:
        router.catch_all(other)
    assert info.value.job_type is None
    assert router._handlers == {"a": noop} and router._catch_all is noop


def test_registration_validates_like_the_worker() -> None:
    router = sepp.Router()
    with pytest.raises(sepp.ValidationError):
        router.handle("a", 42)  # type: ignore[arg-type]
    with pytest.raises(sepp.ValidationError) as info:
        router.handler("")
    assert info.value.field == "job_type"
    assert router.job_types == ()


def test_include_copies_handlers_and_catch_all() -> None:
    emails = sepp.Router().handle("send_welcome", noop)
    billing = sepp.Router().handle("charge", other)
    billing.catch_all(noop)
    app = sepp.Router().include(emails).include(billing)
    assert app._handlers == {"send_welcome": noop, "charge": other}
    assert app._catch_all is noop
    emails.handle("later", other)  # a copy: later registrations are not seen
    assert app.job_types == ("send_welcome", "charge")


def test_include_refuses_clashes_and_copies_nothing() -> None:
    app = sepp.Router().handle("a", noop)
    clash = sepp.Router().handle("new", other).handle("a", other)
    with pytest.raises(sepp.DuplicateHandlerError) as info:
        app.include(clash)
    assert info.value.job_type == "a"
    assert app._handlers == {"a": noop}

    app.catch_all(noop)
    second_catch_all = sepp.Router().handle("fresh", other)
    second_catch_all.catch_all(other)
    with pytest.raises(sepp.DuplicateHandlerError) as info:
        app.include(second_catch_all)
    assert info.value.job_type is None
    assert app._handlers == {"a": noop} and app._catch_all is noop

    with pytest.raises(sepp.ValidationError):
        app.include(object())  # type: ignore[arg-type]


# -- a Worker built from a router --------------------------------------------------------------


def make_worker(fake: FakeClient, **options: Any) -> sepp.Worker:
    return sepp.Worker(
        fake,  # type: ignore[arg-type]
        ["q"],
        logger=RecordingLogger(),
        _wall_clock=fake.now,
        **options,
    )


async def test_worker_runs_the_routers_handlers_and_catch_all(autojump_clock: MockClock) -> None:
    seen: list[tuple[str, str]] = []
    router = sepp.Router()

    @router.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        seen.append(("work", ctx.job_type))

    @router.catch_all
    async def fallback(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        seen.append(("catch_all", ctx.job_type))

    fake = FakeClient()
    worker = make_worker(fake, handlers=router)
    fake.add("work")
    fake.add("mystery")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(1)
        worker.shutdown()
    assert sorted(seen) == [("catch_all", "mystery"), ("work", "work")]
    assert len(fake.acks) == 2 and fake.nacks == []


def test_worker_keeps_its_own_api_and_refuses_duplicates_with_the_router() -> None:
    router = sepp.Router().handle("a", noop)
    router.catch_all(noop)
    worker = make_worker(FakeClient(), handlers=router)
    worker.handle("b", other)
    assert worker._router._handlers == {"a": noop, "b": other} and worker._router._catch_all is noop
    with pytest.raises(sepp.DuplicateHandlerError):
        worker.handle("a", other)
    with pytest.raises(sepp.DuplicateHandlerError):
        worker.catch_all(other)


def test_worker_refuses_handlers_that_are_not_a_router() -> None:
    with pytest.raises(sepp.ValidationError) as info:
        make_worker(FakeClient(), handlers={"a": noop})
    assert info.value.field == "handlers"
