"""Parsing command-line values: durations, timestamps, typed custom entries."""

from __future__ import annotations

import argparse
import json
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from .._model.validate import CustomValue

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON (JSON has no NaN or Infinity)")


def strict_json(text: str | bytes) -> Any:
    """`json.loads`, but NaN, Infinity and -Infinity are refused, as JSON parsers elsewhere do."""
    return json.loads(text, parse_constant=_not_json)


def typed_custom_value(text: str) -> CustomValue:
    """`5` is an int, `5.0` or `1e3` a float, `true`/`false` a bool, anything else a str."""
    if text in ("true", "false"):
        return text == "true"
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        value = float(text)
        if math.isfinite(value):
            return value
    return text


def _split_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def custom_entry(text: str) -> tuple[str, CustomValue]:
    """`--custom KEY=VALUE`: the value typed by `typed_custom_value`."""
    key, value = _split_pair(text)
    return key, typed_custom_value(value)


def custom_str_entry(text: str) -> tuple[str, CustomValue]:
    """`--custom-str KEY=VALUE`: the value kept as a string."""
    return _split_pair(text)


def seconds(text: str) -> float:
    """A non-negative, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number of seconds, got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def timestamp(text: str) -> datetime:
    """ISO 8601 with a UTC offset (`Z` accepted); naive times are refused, not guessed."""
    raw = text.strip()
    if raw[-1:] in ("Z", "z"):
        raw = raw[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2030-01-31T09:00:00Z, got {text!r}"
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no UTC offset; add one, e.g. {text}Z or {text}+02:00"
        )
    return value.astimezone(timezone.utc)


def after(delay_s: float) -> datetime:
    return datetime.now(timezone.utc) + timedelta(seconds=delay_s)
