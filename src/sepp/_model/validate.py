"""Checks made before anything is sent: pure functions raising ValidationError."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone

from .errors import ValidationError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1

CustomValue = str | int | float | bool


def utf8_text(field: str, value: object, *, allow_empty: bool = False) -> str:
    if type(value) is str and value.isascii() and value:
        return value  # the common case, checked in O(1)
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a str, got {type(value).__name__}")
    if not value and not allow_empty:
        raise ValidationError(field, "must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(field, "must be encodable as UTF-8") from None
    return value


def queue_name(field: str, value: object) -> str:
    """A queue name: text without leading or trailing whitespace (" emails" would silently
    be another queue than "emails")."""
    name = utf8_text(field, value)
    if name[0].isspace() or name[-1].isspace():
        raise ValidationError(field, f"must not start or end with whitespace, got {name!r}")
    return name


def optional_text(field: str, value: object) -> str | None:
    return None if value is None else utf8_text(field, value)


def whole_number(field: str, value: object, *, low: int, high: int) -> int:
    # bool is an int subclass; True as a priority is almost certainly a bug.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValidationError(field, f"must be between {low} and {high}, got {value}")
    return value


def seconds(field: str, value: object, *, positive: bool = True, allow_zero: bool = False) -> float:
    """A duration given as float seconds or timedelta, returned as float seconds."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
    else:
        raise ValidationError(
            field, f"must be seconds (float) or a timedelta, got {type(value).__name__}"
        )
    if math.isnan(result) or math.isinf(result):
        raise ValidationError(field, "must be a finite duration")
    if positive and (result < 0 or (result == 0 and not allow_zero)):
        qualifier = "non-negative" if allow_zero else "positive"
        raise ValidationError(field, f"must be {qualifier}, got {result:g}s")
    return result


def aware_datetime(field: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise ValidationError(field, f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(field, "must be timezone-aware (naive datetimes are not guessed)")
    return value.astimezone(timezone.utc)


def custom_map(field: str, value: object) -> dict[str, CustomValue]:
    if type(value) is not dict and not isinstance(value, Mapping):
        raise ValidationError(field, f"must be a mapping, got {type(value).__name__}")
    out: dict[str, CustomValue] = {}
    for key, item in value.items():
        if type(key) is not str or not key.isascii() or not key:
            if not isinstance(key, str) or not key:
                raise ValidationError(field, f"keys must be non-empty str, got {key!r}")
            utf8_text(f"{field}[{key!r}]", key)
        kind = type(item)
        if kind is str:
            if not item.isascii():
                utf8_text(f"{field}[{key!r}]", item, allow_empty=True)
        elif kind is int:
            if not INT64_MIN <= item <= INT64_MAX:
                raise ValidationError(f"{field}[{key!r}]", f"int {item} is outside the int64 range")
        elif kind is not bool and kind is not float:
            item = _custom_value(f"{field}[{key!r}]", item)
        out[key] = item
    return out


def _custom_value(where: str, item: object) -> CustomValue:
    """A custom value of a subclass of the allowed types, or a refusal."""
    if isinstance(item, (bool, float)):
        return item
    if isinstance(item, int):
        if not INT64_MIN <= item <= INT64_MAX:
            raise ValidationError(where, f"int {item} is outside the int64 range")
        return item
    if isinstance(item, str):
        return utf8_text(where, item, allow_empty=True)
    raise ValidationError(where, f"must be str, int, float or bool, got {type(item).__name__}")


def header_safe_api_key(value: object) -> str:
    key = utf8_text("api_key", value)
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in key):
        raise ValidationError(
            "api_key", "must be visible ASCII (no spaces, control characters or CR/LF)"
        )
    return key
