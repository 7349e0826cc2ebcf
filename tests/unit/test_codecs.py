"""Payload codecs: the JSON codec's types, its errors (with the place in the document), its
per-type compiled decoders, and the pydantic and msgspec codecs."""

from __future__ import annotations

import dataclasses
import enum
import json
import uuid
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Annotated, Any, Literal, NewType, Optional, TypedDict, Union

import msgspec
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sepp
from sepp._payloads import json_decoders as _json_decoders


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    qty: int = 1
    note: Optional[str] = None  # noqa: UP045  (the spelling users write)


class Address(TypedDict, total=False):
    city: str
    zip: str


class Required(TypedDict):
    name: str


UserId = NewType("UserId", int)


@dataclasses.dataclass
class Order:
    id: uuid.UUID
    user: UserId
    placed_at: datetime
    ship_on: date
    total: Decimal
    color: Color
    level: Level
    lines: list[Line]
    address: Address
    by_sku: dict[str, Line] = dataclasses.field(default_factory=dict)
    tags: tuple[str, ...] = ()
    pair: tuple[int, str] = (0, "")
    unique: frozenset[int] = frozenset()
    at: time | None = None
    kind: Literal["new", "repeat"] = "new"
    weight: Annotated[float, "kg"] = 0.0
    anything: Any = None
    either: Union[int, str] = 0  # noqa: UP007


@dataclasses.dataclass
class Node:
    name: str
    children: list[Node] = dataclasses.field(default_factory=list)


def an_order() -> Order:
    return Order(
        id=uuid.UUID(int=7),
        user=UserId(42),
        placed_at=datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=timezone(timedelta(hours=2))),
        ship_on=date(2026, 1, 3),
        total=Decimal("10.10"),
        color=Color.BLUE,
        level=Level.HIGH,
        lines=[Line("a"), Line("b", 2, "gift")],
        address={"city": "Oslo"},
        by_sku={"a": Line("a")},
        tags=("x", "y"),
        pair=(1, "one"),
        unique=frozenset({3}),
        at=time(12, 30),
        kind="repeat",
        weight=1.5,
        anything={"free": [1, None]},
        either="s",
    )


CODEC = sepp.JsonCodec()


def test_every_supported_type_round_trips_as_plain_json() -> None:
    order = an_order()
    payload = CODEC.encode(order)
    assert payload.encoding == "application/json"
    document = json.loads(payload.data)
    assert document["id"] == "00000000-0000-0000-0000-000000000007"
    assert document["placed_at"] == "2026-01-02T03:04:05.600000+02:00"
    assert document["total"] == "10.10"  # a string: no float rounding on the way
    assert (document["color"], document["level"]) == ("blue", 2)
    assert document["lines"][1] == {"sku": "b", "qty": 2, "note": "gift"}
    assert CODEC.decode(payload, Order) == order


def test_defaults_and_optional_fields_fill_in_and_unknown_keys_are_ignored() -> None:
    payload = sepp.Payload.json({"sku": "a", "from_a_newer_producer": True})
    assert CODEC.decode(payload, Line) == Line("a", 1, None)


def test_recursive_dataclasses_decode() -> None:
    tree = Node("root", [Node("leaf")])
    assert CODEC.decode(CODEC.encode(tree), Node) == tree


def test_typed_dicts_check_required_keys() -> None:
    assert CODEC.decode(sepp.Payload.json({"name": "n"}), Required) == {"name": "n"}
    with pytest.raises(sepp.PayloadDecodeError, match=r"\$: missing required field 'name'"):
        CODEC.decode(sepp.Payload.json({}), Required)


def test_keys_that_are_not_identifiers_stay_plain_strings() -> None:
    weird = TypedDict("weird", {"a-b": int, "class": str, "it's": bool})
    document = {"a-b": 1, "class": "x", "it's": True}
    assert CODEC.decode(sepp.Payload.json(document), weird) == document
    with pytest.raises(sepp.PayloadDecodeError, match=r"\$\.it's: expected bool, got int"):
        CODEC.decode(sepp.Payload.json({**document, "it's": 1}), weird)
    with pytest.raises(sepp.PayloadDecodeError, match=r"missing required field 'a-b'"):
        CODEC.decode(sepp.Payload.json({"class": "x", "it's": True}), weird)


def test_unhashable_annotations_still_compile() -> None:
    assert CODEC.decode(sepp.Payload.json(3), Annotated[int, {"unit": "kg"}]) == 3  # type: ignore[arg-type]


def test_containers_and_no_payload() -> None:
    assert CODEC.decode(sepp.Payload.json({"a": [1]}), dict) == {"a": [1]}
    assert CODEC.decode(sepp.Payload.json([1, "a"]), list) == [1, "a"]
    assert CODEC.decode(sepp.Payload.json([1, "a"]), tuple) == (1, "a")
    assert CODEC.decode(sepp.Payload.json([1, 2]), list[int]) == [1, 2]
    assert CODEC.decode(sepp.Payload.json({"1": "a"}), dict[int, str]) == {1: "a"}
    assert CODEC.decode(None, Optional[Line]) is None  # type: ignore[arg-type]  # noqa: UP045
    with pytest.raises(sepp.PayloadDecodeError, match="the job has no payload"):
        CODEC.decode(None, Line)


@pytest.mark.parametrize(
    ("document", "error"),
    [
        ({"sku": 1}, "$.sku: expected string, got int"),
        ({"qty": 2}, "$: missing required field 'sku'"),
        ({"sku": "a", "qty": True}, "$.qty: expected integer, got bool"),
        ({"sku": "a", "qty": 1.5}, "$.qty: expected integer, got float"),
        ({"sku": "a", "note": 3}, "$.note: expected string, got int"),
        ([1], "$: expected object, got array"),
    ],
)
def test_the_first_error_names_its_place(document: object, error: str) -> None:
    with pytest.raises(sepp.PayloadDecodeError) as info:
        CODEC.decode(sepp.Payload.json(document), Line)
    assert info.value.error == error
    assert str(info.value) == f"payload does not decode into Line: {error}"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"lines": [{"sku": "a"}, {"sku": 5}]}, "$.lines[1].sku: expected string, got int"),
        ({"placed_at": "yesterday"}, "$.placed_at: expected an ISO 8601 date-time"),
        ({"id": "not-a-uuid"}, "$.id: expected a UUID"),
        ({"color": "green"}, "$.color: expected one of 'red', 'blue', got 'green'"),
        ({"total": "ten"}, "$.total: expected a decimal number or string, got string"),
        ({"by_sku": {"a": {}}}, "$.by_sku['a']: missing required field 'sku'"),
        ({"pair": [1]}, "$.pair: expected 2 items, got 1"),
        ({"kind": "old"}, "$.kind: expected one of 'new', 'repeat', got 'old'"),
        ({"either": None}, "$.either: expected int or str, got null"),
    ],
)
def test_nested_errors_name_their_path(change: dict[str, Any], error: str) -> None:
    document = json.loads(CODEC.encode(an_order()).data)
    with pytest.raises(sepp.PayloadDecodeError) as info:
        CODEC.decode(sepp.Payload.json({**document, **change}), Order)
    assert info.value.error.startswith(error)


def test_bad_bytes_and_other_encodings_are_decode_errors() -> None:
    with pytest.raises(sepp.PayloadDecodeError, match="not valid JSON"):
        CODEC.decode(sepp.Payload(b"{nope", "application/json"), Line)
    with pytest.raises(sepp.PayloadDecodeError, match="not valid JSON"):
        CODEC.decode(sepp.Payload(b"\xff\xfe", "application/json"), Line)
    with pytest.raises(sepp.PayloadDecodeError, match=r"encoding 'text/plain.*' is not JSON"):
        CODEC.decode(sepp.Payload.text('{"sku": "a"}'), Line)
    vendor = sepp.Payload(b'{"sku": "a"}', "application/vnd.shop+json; charset=utf-8")
    assert CODEC.decode(vendor, Line) == Line("a")


def test_unsupported_types_fail_when_compiled_not_per_job() -> None:
    class Plain:
        pass

    with pytest.raises(TypeError, match=r"cannot decode \S*Plain: use a dataclass"):
        CODEC.decode(sepp.Payload.json({}), Plain)
    with pytest.raises(sepp.ValidationError, match="not JSON-serialisable"):
        CODEC.encode(Plain())


def test_a_decoder_is_compiled_once_per_type(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass
    class Fresh:
        n: int

    compiled: list[object] = []
    real = _json_decoders._compile

    def counting(tp: object) -> Any:
        compiled.append(tp)
        return real(tp)

    monkeypatch.setattr(_json_decoders, "_compile", counting)
    codec = sepp.JsonCodec()
    for n in range(3):
        assert codec.decode(sepp.Payload.json({"n": n}), Fresh) == Fresh(n)
    assert compiled.count(Fresh) == 1


@given(
    st.builds(
        Line,
        sku=st.text(),
        qty=st.integers(),
        note=st.none() | st.text(),
    )
)
def test_any_line_round_trips(line: Line) -> None:
    assert CODEC.decode(CODEC.encode(line), Line) == line


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def order_documents() -> st.SearchStrategy[Any]:
    """Valid order documents with fields replaced by arbitrary JSON now and then."""
    base = json.loads(CODEC.encode(an_order()).data)
    return st.dictionaries(st.sampled_from(sorted(base)), JSON_VALUES, max_size=4).map(
        lambda changes: {**base, **changes}
    )


@given(order_documents() | JSON_VALUES)
def test_any_json_either_decodes_or_raises_payload_decode_error(document: Any) -> None:
    # A poison payload must always be recognised as one, never crash the handler adapter.
    try:
        CODEC.decode(sepp.Payload.json(document), Order)
    except sepp.PayloadDecodeError:
        pass


@given(
    st.builds(
        Order,
        id=st.uuids(),
        user=st.integers().map(UserId),
        # Fixed offsets: PEP 495 makes a zone's gap or fold time unequal to every other zone's.
        placed_at=st.datetimes(
            timezones=st.sampled_from(
                [
                    timezone.utc,
                    timezone(timedelta(hours=5, minutes=30)),
                    timezone(-timedelta(hours=8)),
                ]
            )
        ),
        ship_on=st.dates(),
        total=st.decimals(allow_nan=False, allow_infinity=False),
        color=st.sampled_from(Color),
        level=st.sampled_from(Level),
        lines=st.lists(st.builds(Line, sku=st.text(), qty=st.integers())),
        address=st.fixed_dictionaries({}, optional={"city": st.text(), "zip": st.text()}),
        by_sku=st.dictionaries(st.text(), st.builds(Line, sku=st.text())),
        tags=st.lists(st.text()).map(tuple),
        pair=st.tuples(st.integers(), st.text()),
        unique=st.frozensets(st.integers()),
        at=st.none() | st.times(),
        kind=st.sampled_from(["new", "repeat"]),
        weight=st.floats(allow_nan=False, allow_infinity=False),
        anything=JSON_VALUES,
        either=st.integers() | st.text(),
    )
)
def test_any_order_round_trips(order: Order) -> None:
    assert CODEC.decode(CODEC.encode(order), Order) == order


def test_documents_nested_too_deeply_are_decode_errors() -> None:
    deep = sepp.Payload(b'{"name": "n", "children": [' * 5000 + b"]}" * 5000, "application/json")
    with pytest.raises(sepp.PayloadDecodeError, match="nested too deeply"):
        CODEC.decode(deep, Node)


# -- pydantic and msgspec ---------------------------------------------------------------------


class PydanticLine(pydantic.BaseModel):
    sku: str
    qty: int = 1


class MsgspecLine(msgspec.Struct):
    sku: str
    qty: int = 1


def test_tasks_pick_the_codec_of_their_models_library() -> None:
    assert isinstance(sepp.Task("q", "t", PydanticLine).codec, sepp.PydanticCodec)
    assert isinstance(sepp.Task("q", "t", MsgspecLine).codec, sepp.MsgspecCodec)
    assert isinstance(sepp.Task("q", "t", Line).codec, sepp.JsonCodec)


def test_pydantic_models_are_validated_by_pydantic() -> None:
    codec = sepp.PydanticCodec()
    payload = codec.encode(PydanticLine(sku="a", qty=2))
    assert json.loads(payload.data) == {"sku": "a", "qty": 2}
    assert codec.decode(payload, PydanticLine) == PydanticLine(sku="a", qty=2)
    with pytest.raises(sepp.PayloadDecodeError) as info:
        codec.decode(sepp.Payload.json({"sku": "a", "qty": "many"}), PydanticLine)
    assert info.value.error.startswith("qty: Input should be a valid integer")
    with pytest.raises(sepp.PayloadDecodeError, match="is not JSON"):
        codec.decode(sepp.Payload.text("x"), PydanticLine)


@pytest.mark.parametrize("form", ["json", "msgpack"])
def test_msgspec_structs_round_trip_in_both_formats(form: Literal["json", "msgpack"]) -> None:
    codec = sepp.MsgspecCodec(form)
    payload = codec.encode(MsgspecLine("a", 2))
    expected = "application/json" if form == "json" else "application/msgpack"
    assert payload.encoding == expected
    # Either format decodes, whatever the codec writes: the label says which.
    assert sepp.MsgspecCodec().decode(payload, MsgspecLine) == MsgspecLine("a", 2)
    with pytest.raises(sepp.PayloadDecodeError, match=r"Expected `int`, got `str` - at `\$.qty`"):
        codec.decode(sepp.Payload.json({"sku": "a", "qty": "x"}), MsgspecLine)
    with pytest.raises(sepp.PayloadDecodeError, match="neither JSON nor MessagePack"):
        codec.decode(sepp.Payload.text("x"), MsgspecLine)


def test_msgspec_codec_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="json' or 'msgpack"):
        sepp.MsgspecCodec("yaml")  # type: ignore[arg-type]


@pytest.mark.parametrize("number", [float("nan"), float("inf")])
def test_nan_and_infinity_are_refused_when_encoding(number: float) -> None:
    # Python's json would write NaN/Infinity, which no other client can parse.
    with pytest.raises(sepp.ValidationError, match="not JSON-serialisable"):
        CODEC.encode({"weight": number})


@dataclasses.dataclass
class AnyData:
    user: int
    extra: Any = None


class AnyPydantic(pydantic.BaseModel):
    user: int
    extra: Any = None


class AnyStruct(msgspec.Struct):
    user: int
    extra: Any = None


class Unencodable:
    """No codec knows how to write it."""


class FailingCodec(sepp.JsonCodec):
    """A custom codec whose encode fails with an error of its own."""

    def encode(self, value: Any) -> sepp.Payload:
        raise RuntimeError("the schema registry is down")


TASKS: list[sepp.Task[Any]] = [
    sepp.Task("q", "dataclass", AnyData),
    sepp.Task("q", "pydantic", AnyPydantic),
    sepp.Task("q", "msgspec", AnyStruct),
    sepp.Task("q", "msgpack", AnyStruct, codec=sepp.MsgspecCodec("msgpack")),
]


@pytest.mark.parametrize("task", TASKS, ids=[task.job_type for task in TASKS])
def test_a_payload_of_another_type_is_a_validation_error_naming_payload(
    task: sepp.Task[Any],
) -> None:
    for call in (task.request, task.encode):
        with pytest.raises(sepp.ValidationError) as info:
            call({"user": 1})
        assert info.value.field == "payload"
        assert f"takes {task.payload_type.__name__} payloads, got dict" in str(info.value)


@pytest.mark.parametrize("task", TASKS, ids=[task.job_type for task in TASKS])
def test_a_value_the_codec_cannot_encode_is_a_validation_error_with_its_cause(
    task: sepp.Task[Any],
) -> None:
    with pytest.raises(sepp.ValidationError) as info:
        task.request(task.payload_type(user=1, extra=Unencodable()))
    assert info.value.field == "payload"
    assert isinstance(info.value.__cause__, Exception)  # the library's own error, kept
    assert not isinstance(info.value.__cause__, sepp.SeppError)


@pytest.mark.parametrize(
    ("codec", "value"),
    [
        (sepp.PydanticCodec(), AnyPydantic(user=1, extra=Unencodable())),
        (sepp.MsgspecCodec(), Unencodable()),
        (sepp.MsgspecCodec("msgpack"), Unencodable()),
        (sepp.JsonCodec(), Unencodable()),
    ],
)
def test_each_codec_refuses_what_it_cannot_encode_with_a_validation_error(
    codec: sepp.PayloadCodec, value: object
) -> None:
    with pytest.raises(sepp.ValidationError) as info:
        codec.encode(value)
    assert info.value.field == "payload"
    assert isinstance(info.value.__cause__, Exception)


def test_the_pydantic_codec_refuses_what_is_not_a_model() -> None:
    with pytest.raises(sepp.ValidationError, match="must be a pydantic model, got dict"):
        sepp.PydanticCodec().encode({"user": 1})


def test_a_custom_codecs_own_error_becomes_a_validation_error() -> None:
    task = sepp.Task("q", "t", AnyData, codec=FailingCodec())
    with pytest.raises(sepp.ValidationError, match="the schema registry is down") as info:
        task.request(AnyData(1))
    assert info.value.field == "payload"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_int_is_a_float_payload_and_untestable_types_are_left_to_the_codec() -> None:
    assert sepp.Task("q", "t", float).request(1).payload == sepp.Payload.json(1)
    assert sepp.Task("q", "t", list[int]).request([1]).payload == sepp.Payload.json([1])

    class Refund(TypedDict):
        amount: int

    assert sepp.Task("q", "t", Refund).request({"amount": 1}).payload == sepp.Payload.json(
        {"amount": 1}
    )
