"""The failure policy's decisions and checks, and the on_dead_letter hook's checks, without a
server: what `retry_on` and `give_up_on` decide for each exception (subclasses, exception
groups, HandlerErrors), and what is refused where it is given."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import trio
from fixtures.fake_client import FakeClient

import sepp
from sepp._worker.dead_letter_hooks import checked_hook
from sepp._worker.failure_policy import FailurePolicy
from sepp._worker.processing import HandlerTimeoutError
from sepp.testing import job_context


def decide(retry_on: Any, give_up_on: Any, error: Exception) -> str | None:
    return FailurePolicy(retry_on, give_up_on).gives_up(error)


def test_give_up_on_matches_subclasses_and_wins_over_retry_on() -> None:
    assert (
        decide(None, (LookupError,), KeyError("k")) == "LookupError is in give_up_on: not retried"
    )
    assert decide(None, (LookupError,), ValueError("v")) is None
    # Listed in both: give_up_on is asked first.
    assert decide((OSError,), (FileNotFoundError,), FileNotFoundError()) is not None
    assert decide((OSError,), (FileNotFoundError,), ConnectionError()) is None


def test_with_retry_on_only_those_retry() -> None:
    assert decide((ConnectionError, TimeoutError), None, ConnectionResetError()) is None
    assert decide((ConnectionError, TimeoutError), None, ValueError()) == (
        "not in retry_on (ConnectionError, TimeoutError): not retried"
    )
    assert decide((), None, ConnectionError()) == "not in retry_on (nothing): not retried"
    # A timeout is a trio.TooSlowError to the policy.
    timeout = HandlerTimeoutError(5)
    assert decide((trio.TooSlowError,), None, timeout) is None


def test_an_exception_group_is_matched_leaf_by_leaf() -> None:
    group = ExceptionGroup("two", [ValueError("a"), ExceptionGroup("in", [KeyError("b")])])
    assert decide(None, (LookupError,), group) == "LookupError is in give_up_on: not retried"
    assert decide((ValueError, KeyError), None, group) is None
    assert decide((ValueError,), None, group) is not None  # its KeyError is not listed
    # A HandlerError in a mixed group is not held against retry_on.
    mixed = ExceptionGroup("m", [ValueError("a"), sepp.HandlerError.retry("later")])
    assert decide((ValueError,), None, mixed) is None


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("give_up_on", "ValueError", "must be an exception class or a tuple of them"),
        ("retry_on", (ValueError, 3), r"retry_on\[1\]: must be an exception class"),
        ("retry_on", (ValueError, int), r"retry_on\[1\]: must be an exception class"),
        ("give_up_on", (sepp.HandlerError,), "keeps its meaning"),
        ("retry_on", KeyboardInterrupt, "retry_on: KeyboardInterrupt is not an Exception"),
        ("give_up_on", [asyncio.CancelledError], "never fail a job"),
        ("give_up_on", [trio.Cancelled], "never fail a job"),
    ],
)
def test_a_policy_that_cannot_work_is_refused_where_it_is_given(
    option: str, value: object, message: str
) -> None:
    async def handler(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

    task = sepp.Task("q", "typed", dict)
    attempts = [
        lambda: sepp.Router(**{option: value}),
        lambda: sepp.Router().handler("t", **{option: value}),
        lambda: sepp.Router().handle("t", handler, **{option: value}),
        lambda: sepp.Router().task(task, **{option: value}),
        lambda: sepp.Worker(FakeClient(), "q", **{option: value}),  # type: ignore[arg-type]
        lambda: sepp.Worker(FakeClient(), "q").handle("t", handler, **{option: value}),  # type: ignore[arg-type]
    ]
    for attempt in attempts:
        with pytest.raises(sepp.ValidationError, match=message):
            attempt()


def test_a_hook_is_checked_where_it_is_given() -> None:
    with pytest.raises(sepp.ValidationError, match="on_dead_letter: must be a function"):
        sepp.Router(on_dead_letter="alert")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"cannot be called as hook\(ctx, exc\)"):
        sepp.Worker(FakeClient(), "q", on_dead_letter=lambda ctx: None)  # type: ignore[arg-type]
    assert checked_hook("on_dead_letter", None) == ()


async def test_an_async_hook_is_awaited_and_a_def_hook_runs_in_a_thread() -> None:
    import threading

    seen: list[tuple[str, object]] = []

    async def async_hook(ctx: sepp.JobContext, exc: Exception | None) -> None:
        seen.append(("async", threading.get_ident()))

    class Callable:
        async def __call__(self, ctx: sepp.JobContext, exc: Exception | None) -> None:
            seen.append(("object", threading.get_ident()))

    def def_hook(ctx: sepp.JobContext, exc: Exception | None) -> None:
        seen.append(("def", threading.get_ident()))
        assert isinstance(ctx, sepp.SyncJobContext)

    ctx = job_context()
    for hook in (async_hook, Callable(), def_hook):
        ((_name, call),) = checked_hook("on_dead_letter", hook)
        await call(ctx, None)
    here = threading.get_ident()
    assert [(kind, ident == here) for kind, ident in seen] == [
        ("async", True),
        ("object", True),
        ("def", False),
    ]
    assert checked_hook("on_dead_letter", def_hook)[0].name.endswith("def_hook")
