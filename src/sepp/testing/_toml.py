"""A tiny TOML *writer* used to hand configuration files to a test server.

The standard library can read TOML (``tomllib``, Python 3.11+) but not write
it, and this package must not depend on anything beyond the stdlib and trio,
so this module implements the small subset needed for sepp configs:

* scalars: ``str``, ``int`` (64-bit range), ``float`` (including ``inf`` and
  ``nan``), ``bool`` and ``datetime``/``date``/``time`` objects;
* lists (and tuples) of any of the supported values, written as inline arrays;
* mappings, written as ``[tables]`` (or inline ``{ ... }`` tables where they
  appear inside an array or an inline table);
* lists of mappings directly under the document root, written as arrays of
  tables (``[[queues]]``).  A list of mappings anywhere deeper (for example
  ``auth.api_keys``) is written as an inline array of inline tables:
  ``api_keys = [{ name = "x", key = "y" }]``.

A key whose value is ``None`` is left out of the document (TOML has no null),
which makes it easy to "unset" a key of a default config.  ``None`` inside a
list is an error.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping, Sequence

__all__ = ["dumps"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def dumps(data: Mapping[str, object]) -> str:
    """Serialise ``data`` to a TOML document.

    Raises ``TypeError`` for values that cannot be represented (for example
    ``None`` inside a list, or a non-string key) and ``ValueError`` for
    integers outside the signed 64-bit range or strings that are not valid
    Unicode scalar sequences (lone surrogates).
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"a TOML document must be a mapping, not {type(data).__name__}")
    out: list[str] = []
    _write_table(data, (), out, root=True)
    text = "\n".join(out)
    return text + "\n" if text else ""


def _write_table(
    table: Mapping[str, object], path: tuple[str, ...], out: list[str], *, root: bool
) -> None:
    """Write the body of ``table`` (located at ``path``) followed by its sub-tables."""
    subtables: list[tuple[str, Mapping[str, object]]] = []
    arrays_of_tables: list[tuple[str, list[Mapping[str, object]]]] = []
    for key, value in table.items():
        _check_key(key)
        if value is None:
            continue
        if isinstance(value, Mapping):
            subtables.append((key, value))
        elif root and _is_array_of_tables(value):
            assert isinstance(value, Sequence)
            arrays_of_tables.append((key, [v for v in value if isinstance(v, Mapping)]))
        else:
            out.append(f"{_format_key(key)} = {_format_value(value)}")

    for key, sub in subtables:
        sub_path = (*path, key)
        _blank_line(out)
        out.append(f"[{_format_path(sub_path)}]")
        _write_table(sub, sub_path, out, root=False)

    for key, items in arrays_of_tables:
        sub_path = (*path, key)
        for item in items:
            _blank_line(out)
            out.append(f"[[{_format_path(sub_path)}]]")
            _write_table(item, sub_path, out, root=False)


def _blank_line(out: list[str]) -> None:
    if out and out[-1] != "":
        out.append("")


def _is_array_of_tables(value: object) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(v, Mapping) for v in value)
    )


def _check_key(key: object) -> None:
    if not isinstance(key, str):
        raise TypeError(f"TOML keys must be strings, not {type(key).__name__}: {key!r}")


def _format_key(key: str) -> str:
    if _BARE_KEY.fullmatch(key):
        return key
    return _format_string(key)


def _format_path(path: tuple[str, ...]) -> str:
    return ".".join(_format_key(part) for part in path)


def _format_string(value: str) -> str:
    parts: list[str] = []
    for ch in value:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            parts.append(escaped)
            continue
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"cannot write a lone surrogate (U+{code:04X}) to TOML")
        if code < 0x20 or code == 0x7F:
            parts.append(f"\\u{code:04X}")
        else:
            parts.append(ch)
    return '"' + "".join(parts) + '"'


def _format_float(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = repr(value)
    # repr() always produces a valid TOML float ("1.5", "1e+16", "-0.0", "5e-324")
    # except that an integral value may lack a fraction part in some formats.
    if not any(c in text for c in ".eE"):
        text += ".0"
    return text


def _format_value(value: object) -> str:
    """Format ``value`` as an inline TOML value (single line)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"integer {value} is outside the TOML (signed 64-bit) range")
        return str(value)
    if isinstance(value, float):
        return _format_float(value)
    if isinstance(value, str):
        return _format_string(value)
    if isinstance(value, datetime.time) and value.tzinfo is not None:
        raise ValueError("TOML local times cannot carry a UTC offset")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, Mapping):
        items = []
        for key, item in value.items():
            _check_key(key)
            if item is None:
                continue
            items.append(f"{_format_key(key)} = {_format_value(item)}")
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(value, (list, tuple)):
        elements = []
        for item in value:
            if item is None:
                raise TypeError("TOML arrays cannot contain None")
            elements.append(_format_value(item))
        return "[" + ", ".join(elements) + "]"
    raise TypeError(f"cannot write a value of type {type(value).__name__} to TOML: {value!r}")
