"""The tiny TOML writer behind ``sepp.testing`` round-trips through a real parser."""

from __future__ import annotations

import datetime
import math
import tomllib
from typing import Any

import pytest
from fixtures.fuzz import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sepp.testing import toml_dumps


def roundtrip(data: dict[str, Any]) -> dict[str, Any]:
    text = toml_dumps(data)
    try:
        parsed: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # pragma: no cover - shows the document
        raise AssertionError(f"invalid TOML ({exc}):\n{text}") from exc
    return parsed


def strip_none(value: Any) -> Any:
    """What the writer promises: keys whose value is None are left out."""
    if isinstance(value, dict):
        return {k: strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [strip_none(v) for v in value]
    return value


SHAPES: list[dict[str, Any]] = [
    {},
    {"a": 1},
    {"a": "text", "b": True, "c": False, "d": 1.5, "e": -7, "f": 0},
    {"int64": [2**63 - 1, -(2**63)]},
    {"floats": [0.0, -0.0, 1e300, 5e-324, 1e16, 123456.789, -2.5e-7]},
    {"empty_list": [], "empty_table": {}},
    {"nested": {"deeper": {"deepest": {"x": 1}}}},
    {"server": {"strict_queues": True}, "admin": {"enabled": False}},
    {"list": [1, "two", 3.0, True]},
    {"list_of_lists": [[1, 2], ["a"], [], [[True]]]},
    # Array of tables at the root: [[queues]].
    {
        "queues": [
            {"name": "main", "allowed_job_types": ["echo", "boom"], "default_max_attempts": 2},
            {"name": "other", "retry_backoff": "exponential"},
        ]
    },
    # Array of tables whose elements have sub-tables and nested lists of tables.
    {
        "queues": [
            {"name": "a", "sub": {"x": 1, "inner": {"y": [1, 2]}}, "keys": [{"k": "v"}]},
            {"name": "b"},
        ],
        "after": {"z": 1},
    },
    # A list of tables nested inside a table: written inline.
    {"auth": {"api_keys": [{"name": "suite", "key": "suite-secret-0001"}]}},
    {"auth": {"api_keys": []}},
    {"admin": {"keys": [{"name": "a", "key": "b", "role": "viewer"}, {"name": "c", "key": "d"}]}},
    # Inline tables within inline tables, and mixed arrays.
    {"t": {"mixed": [{"a": {"b": {"c": [1, {"d": "e"}]}}}, 1, "x", {}]}},
    # Keys that need quoting.
    {"": 1, "with space": 2, "dotted.key": 3, 'quo"te': 4, "ünï": 5, "a-b_C9": 6},
    {"table with space": {"k.e.y": {"": "empty"}}},
    # Strings needing escapes.
    {
        "s": 'quote " backslash \\ tab \t newline \n cr \r ff \f bs \b',
        "ctrl": "\x00\x01\x1f\x7f",
        "unicode": "héllo wörld ✓ 🎉 \u2028 \ufeff",
        "looks_like_toml": "a = 1\n[table]\n[[aot]]",
        "triple": '"""',
        "single": "'''",
    },
    {"dates": [datetime.date(2024, 2, 29), datetime.time(12, 30, 1, 500)]},
    {"dt": datetime.datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=datetime.timezone.utc)},
    {"local_dt": datetime.datetime(2024, 1, 2, 3, 4, 5)},
    {"tuple": (1, 2, 3), "tuple_of_tables": ({"a": 1},)},
]


@pytest.mark.parametrize("data", SHAPES, ids=range(len(SHAPES)))
def test_shapes_roundtrip(data: dict[str, Any]) -> None:
    assert roundtrip(data) == strip_none(data)


def test_none_values_are_omitted() -> None:
    data = {"a": None, "b": {"c": None, "d": 1}, "q": [{"name": "x", "gone": None}]}
    assert roundtrip(data) == {"b": {"d": 1}, "q": [{"name": "x"}]}
    assert roundtrip({"t": {"l": [{"a": None, "b": 2}]}}) == {"t": {"l": [{"b": 2}]}}


def test_special_floats() -> None:
    parsed = roundtrip({"pinf": math.inf, "ninf": -math.inf, "nan": math.nan})
    assert parsed["pinf"] == math.inf
    assert parsed["ninf"] == -math.inf
    assert math.isnan(parsed["nan"])


def test_root_array_of_tables_layout() -> None:
    text = toml_dumps({"server": {"strict_queues": True}, "queues": [{"name": "a"}, {"name": "b"}]})
    assert "[[queues]]" in text
    assert text.count("[[queues]]") == 2
    assert "[server]" in text


def test_api_keys_are_inline_tables() -> None:
    text = toml_dumps({"auth": {"api_keys": [{"name": "x", "key": "y"}]}})
    assert text == '[auth]\napi_keys = [{ name = "x", key = "y" }]\n'


def test_scalars_come_before_tables() -> None:
    text = toml_dumps({"sub": {"a": 1}, "top": 2})
    assert text.index("top = 2") < text.index("[sub]")
    assert roundtrip({"sub": {"a": 1}, "top": 2}) == {"sub": {"a": 1}, "top": 2}


def test_minimal_test_config_from_protocol_notes() -> None:
    config = {
        "server": {"strict_queues": True},
        "admin": {"enabled": False},
        "auth": {"api_keys": [{"name": "suite", "key": "suite-secret-0001"}]},
        "storage": {
            "dead_letter_retention_ms": 600_000,
            "dedup_window_ms": 60_000,
            "persist_mode": "sync_data",
        },
        "limits": {"max_wait_timeout_ms": 30_000},
        "queues": [
            {
                "name": "main",
                "allowed_job_types": ["echo", "boom"],
                "default_max_attempts": 2,
                "max_payload_bytes": 65536,
                "max_queue_depth": 500,
                "retry_delay_ms": 1000,
                "retry_backoff": "exponential",
                "retry_delay_max_ms": 8000,
            }
        ],
    }
    assert roundtrip(config) == config


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"a": [None]}, TypeError),
        ({"a": object()}, TypeError),
        ({"a": {1: "x"}}, TypeError),
        ({1: "x"}, TypeError),
        ({"a": b"bytes"}, TypeError),
        ({"a": 2**63}, ValueError),
        ({"a": -(2**63) - 1}, ValueError),
        ({"a": "\ud800"}, ValueError),
        ({"a": datetime.time(1, 2, tzinfo=datetime.timezone.utc)}, ValueError),
    ],
)
def test_unrepresentable_values_raise(data: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        toml_dumps(data)


def test_document_must_be_a_mapping() -> None:
    with pytest.raises(TypeError):
        toml_dumps([1, 2])  # type: ignore[arg-type]


# --------------------------------------------------------------- hypothesis

keys = st.text(max_size=12)
scalars = (
    st.text(max_size=20)
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.booleans()
    | st.floats(allow_nan=False)
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=25,
)
documents = st.dictionaries(keys, values, max_size=6)
tables = st.dictionaries(keys, scalars | st.lists(scalars, max_size=3), max_size=4)
# Documents with arrays of tables at the root and lists of tables nested inside tables.
aot_documents = st.dictionaries(
    keys,
    st.lists(st.dictionaries(keys, values, max_size=4), min_size=1, max_size=3)
    | st.dictionaries(keys, st.lists(tables, max_size=3) | values, max_size=4),
    max_size=4,
)


@settings(max_examples=examples(300), deadline=None)
@given(documents)
def test_arbitrary_nested_documents_roundtrip(data: dict[str, Any]) -> None:
    assert roundtrip(data) == data


@settings(max_examples=examples(200), deadline=None)
@given(aot_documents)
def test_arbitrary_arrays_of_tables_roundtrip(data: dict[str, Any]) -> None:
    assert roundtrip(data) == data


@settings(max_examples=examples(200), deadline=None)
@given(st.text())
def test_arbitrary_strings_roundtrip(text: str) -> None:
    assert roundtrip({text: text, "t": {text: [text]}}) == {text: text, "t": {text: [text]}}
