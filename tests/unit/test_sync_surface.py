"""SyncClient keeps the async client's surface: the same options as sepp.open() and a blocking
twin, with the same signature and docstring, of every public call of sepp.Client."""

from __future__ import annotations

import inspect
import typing

import sepp
from sepp._client.sync import ConnectOptionsDict


def test_the_options_are_those_of_open() -> None:
    params = inspect.signature(sepp.open).parameters.values()
    keyword_only = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(typing.get_type_hints(ConnectOptionsDict)) == keyword_only


def test_every_call_of_the_client_has_a_blocking_twin() -> None:
    calls = {  # (through getattr: a call a `def` handler's thread refuses is a descriptor)
        name
        for name in vars(sepp.Client)
        if not name.startswith("_") and inspect.iscoroutinefunction(getattr(sepp.Client, name))
    }
    assert calls == {
        "enqueue",
        "enqueue_batch",
        "enqueue_atomic",
        "reserve",
        "ack",
        "nack",
        "extend",
        "drain_dead_letters",
        "get_server_info",
    }
    for name in calls:
        twin = getattr(sepp.SyncClient, name)
        assert not inspect.iscoroutinefunction(twin)
        assert inspect.signature(twin) == inspect.signature(getattr(sepp.Client, name))
        assert twin.__doc__ == getattr(sepp.Client, name).__doc__
