"""What a child tells its supervisor (`_cli/fleet/messages.py`): every message encodes and
decodes to itself, anything else is refused with MessageError, and a child's health route
answers its monitor's health as data."""

from __future__ import annotations

import json

import pytest
from fixtures.fuzz import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sepp._cli.fleet.child import SupervisorLink
from sepp._cli.fleet.messages import (
    HEALTH_CONTENT_TYPE,
    HEALTH_PATH,
    Message,
    MessageError,
    Ports,
    Reserving,
    TakesSignals,
    decode,
    encode,
)
from sepp._worker.monitor import Health, WorkerMonitor, feed_of

ports = st.one_of(st.none(), st.integers(1, 65535))
messages = st.one_of(
    st.builds(Ports, ports, ports),
    st.just(TakesSignals()),
    st.builds(Reserving, st.text()),
    st.builds(
        Health,
        st.booleans(),
        st.booleans(),
        st.text(),
        st.one_of(st.none(), st.floats(min_value=0, allow_nan=False, allow_infinity=False)),
    ),
)


@settings(max_examples=examples(200))
@given(messages)
def test_every_message_decodes_to_itself(message: Message) -> None:
    assert decode(encode(message)) == message


def test_the_wire_form_is_a_tagged_json_array() -> None:
    assert encode(Ports(health=8080)) == b'["ports",8080,null]'
    assert encode(TakesSignals()) == b'["takes-signals"]'
    assert encode(Reserving("w-1")) == b'["reserving","w-1"]'
    assert encode(Health(True, False, "waiting", 0.5)) == b'["health",true,false,"waiting",0.5]'
    assert decode(b'["health",true,true,"ok",0]') == Health(True, True, "ok", 0.0)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff",
        b"{}",
        b"[]",
        b'"ports"',
        b'["ports",8080]',
        b'["ports",0,null]',
        b'["ports",65536,null]',
        b'["ports",true,null]',
        b'["ports","8080",null]',
        b'["takes-signals",1]',
        b'["reserving"]',
        b'["reserving",7]',
        b'["health",1,true,"ok",null]',
        b'["health",true,true,"ok",-1]',
        b'["health",true,true,"ok","0.1"]',
        b'["health",true,true,null,0.1]',
        b'["unknown"]',
    ],
)
def test_what_is_no_message_is_refused(data: bytes) -> None:
    with pytest.raises(MessageError):
        decode(data)


@given(st.binary(max_size=64))
@settings(max_examples=examples(200))
def test_decode_refuses_or_returns_a_message_never_anything_else(data: bytes) -> None:
    try:
        message = decode(data)
    except MessageError:
        return
    assert decode(encode(message)) == message


def test_a_childs_health_route_answers_its_monitors_health() -> None:
    monitor = WorkerMonitor()
    feed_of(monitor).reserving()
    [(path, route)] = SupervisorLink.health_route(monitor).items()
    assert path == HEALTH_PATH
    status, content_type, body = route()
    assert (status, content_type) == (200, HEALTH_CONTENT_TYPE)
    assert decode(body) == Health(True, True, "reserving", None)
    assert json.loads(body)[0] == "health"
    feed_of(monitor).stopped()
    assert decode(route()[2]) == Health(False, False, "stopped", None)
