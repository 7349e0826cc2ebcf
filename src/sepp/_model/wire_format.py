"""Protobuf's wire format, just what sepp's messages use: varints, tags, lengths, and a
schema-driven reader that decodes one message into a dict of its fields by name.

The reader follows upb (protobuf's C implementation, the one CPython's wheels carry) wherever
protobuf's implementations disagree: a tag or a length takes at most 5 bytes, field numbers stop
at 2**29 - 1, groups nest at most 100 deep, a map entry with an unknown field is dropped.
Everything else is what every implementation does: unknown fields (every wire type, groups
included) are skipped, a field with the wrong wire type is an unknown field, the last of a
repeated singular scalar wins, repeated occurrences of a message field merge (which is parsing
their concatenation), and strings must be valid UTF-8."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

VARINT: Final = 0
I64: Final = 1
LEN: Final = 2
SGROUP: Final = 3
EGROUP: Final = 4
I32: Final = 5

MAX_FIELD_NUMBER: Final = (1 << 29) - 1
MAX_GROUP_DEPTH: Final = 100
_MASK64: Final = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")


class DecodeError(ValueError):
    """Bytes that are not a valid encoding of the message they were read as."""


# -- writing --------------------------------------------------------------------------------

_ONE_BYTE: Final = [bytes((n,)) for n in range(128)]


def varint(value: int) -> bytes:
    """The varint of `value`; a negative one as its 64-bit two's complement (10 bytes)."""
    if 0 <= value < 128:
        return _ONE_BYTE[value]
    if 0 < value < 16384:  # a payload's size, most often: two bytes, no loop
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0:
        value &= _MASK64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def utf8(field: str, text: str) -> bytes:
    """`text` as UTF-8; a lone surrogate (which protobuf refuses too) is a ValueError."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{field} is not encodable as UTF-8") from None


def double(value: float) -> bytes:
    return _DOUBLE.pack(value)


# -- reading --------------------------------------------------------------------------------


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at `pos` (at most 10 bytes, kept to 64 bits) and the position after it."""
    if pos >= end:
        raise DecodeError("truncated varint")
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    value = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise DecodeError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _MASK64, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def _read_short_varint(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """A tag or a length: at most 5 bytes and 32 bits, as upb reads them."""
    if pos < end and buf[pos] < 0x80:
        return buf[pos], pos + 1
    start = pos
    value, pos = read_varint(buf, pos, end)
    if pos - start > 5 or value >> 32:
        raise DecodeError(f"{what} longer than 5 bytes")
    return value, pos


def _skip_group(buf: bytes, pos: int, end: int, number: int, depth: int) -> int:
    """The position after the group `number` whose start tag ends before `pos`."""
    stack = [number]
    while True:
        if len(stack) + depth > MAX_GROUP_DEPTH:
            raise DecodeError("groups nested too deep")
        if pos >= end:
            raise DecodeError("group without its end tag")
        tag, pos = _read_short_varint(buf, pos, end, "tag")
        field, wire = tag >> 3, tag & 7
        if field > MAX_FIELD_NUMBER:  # (upb lets field number 0 pass inside a group)
            raise DecodeError("field number too large")
        if wire == EGROUP:
            if stack.pop() != field:
                raise DecodeError("end-group tag does not match its start")
            if not stack:
                return pos
        elif wire == SGROUP:
            stack.append(field)
        else:
            pos = _skip_value(buf, pos, end, wire)


def _skip_value(buf: bytes, pos: int, end: int, wire: int) -> int:
    if wire == VARINT:
        return read_varint(buf, pos, end)[1]
    if wire == LEN:
        size, pos = _read_short_varint(buf, pos, end, "length")
        pos += size
    elif wire == I64:
        pos += 8
    elif wire == I32:
        pos += 4
    else:
        raise DecodeError(f"invalid wire type {wire}")
    if pos > end:
        raise DecodeError("field runs past the end of the message")
    return pos


# A field of a schema: (name, kind, sub-schema for messages, oneof name or None).
# Kinds say how the value is read and kept.
STRING: Final = 0  # str, last one wins
BYTES: Final = 1  # bytes, last one wins
UINT32: Final = 2
UINT64: Final = 3
INT32: Final = 4  # and enums
INT64: Final = 5
BOOL: Final = 6
DOUBLE: Final = 7
MESSAGE: Final = 8  # a dict; repeated occurrences merge
STRINGS: Final = 9  # repeated string: a list
MESSAGES: Final = 10  # repeated message: a list of dicts

_WIRE_OF_KIND: Final = (LEN, LEN, VARINT, VARINT, VARINT, VARINT, VARINT, I64, LEN, LEN, LEN)

Field = tuple[str, int, "Schema | None", "str | None"]
# Set in a decoded message that had unknown fields: upb drops such a map entry.
UNKNOWN: Final = "(unknown fields)"
Schema = dict[int, Field]


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >> 31 else value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


_VARINT_OF_KIND: dict[int, Callable[[int], Any]] = {
    UINT32: lambda value: value & 0xFFFFFFFF,
    UINT64: lambda value: value,
    INT32: _int32,
    INT64: _int64,
    BOOL: lambda value: value != 0,
}


# A schema by tag (field number and wire type in one varint, as they arrive): a known field
# is one dict lookup. Built once per schema; schemas are module constants.
_BY_TAG: dict[int, dict[int, tuple[int, str, int, Schema | None, str | None]]] = {}


def _by_tag(schema: Schema) -> dict[int, tuple[int, str, int, Schema | None, str | None]]:
    tags = _BY_TAG.get(id(schema))
    if tags is None:
        tags = _BY_TAG[id(schema)] = {
            number << 3 | _WIRE_OF_KIND[kind]: (number, name, kind, sub, oneof)
            for number, (name, kind, sub, oneof) in schema.items()
        }
    return tags


def decode(buf: bytes, schema: Schema, depth: int = 0) -> dict[str, Any]:
    """The fields of one message, by name; nested messages decoded too (dicts and lists of
    dicts). Fields absent from `buf` are absent from the dict: defaults are the caller's."""
    tags = _BY_TAG.get(id(schema)) or _by_tag(schema)
    out: dict[str, Any] = {}
    chosen: dict[str, int] | None = None  # oneof name -> the member set last
    messages: dict[int, list[bytes]] | None = None  # singular message fields' occurrences
    pos = 0
    end = len(buf)
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _read_short_varint(buf, pos, end, "tag")
        known = tags.get(tag)
        if known is None:
            pos = _skip_unknown(buf, pos, end, tag, depth)
            out[UNKNOWN] = True
            continue
        number, name, kind, sub, oneof = known
        if oneof is not None:
            if chosen is None:
                chosen = {}
            before = chosen.get(oneof)
            if before != number:
                if before is not None:
                    out.pop(schema[before][0], None)
                    if messages is not None and before in messages:
                        # Cleared, but protobuf parsed it as it came: it must parse.
                        for dropped in messages.pop(before):
                            decode(dropped, schema[before][2] or {}, depth + 1)
                chosen[oneof] = number
        wire = tag & 7
        if wire == VARINT:
            if pos < end and buf[pos] < 0x80:
                value = buf[pos]
                pos += 1
                out[name] = value != 0 if kind == BOOL else value
            else:
                value, pos = read_varint(buf, pos, end)
                out[name] = _VARINT_OF_KIND[kind](value)
            continue
        if wire == I64:
            if pos + 8 > end:
                raise DecodeError("field runs past the end of the message")
            out[name] = _DOUBLE.unpack_from(buf, pos)[0]
            pos += 8
            continue
        if pos < end and buf[pos] < 0x80:
            stop = pos + 1 + buf[pos]
            pos += 1
        else:
            size, pos = _read_short_varint(buf, pos, end, "length")
            stop = pos + size
        if stop > end:
            raise DecodeError("field runs past the end of the message")
        raw = buf[pos:stop]
        pos = stop
        if kind == STRING or kind == STRINGS:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DecodeError(f"field {name} is not valid UTF-8") from None
            if kind == STRING:
                out[name] = text
            else:
                out.setdefault(name, []).append(text)
        elif kind == BYTES:
            out[name] = raw
        elif kind == MESSAGE:
            if messages is None:
                messages = {number: [raw]}
            elif number in messages:
                messages[number].append(raw)
            else:
                messages[number] = [raw]
        else:
            assert sub is not None
            out.setdefault(name, []).append(decode(raw, sub, depth + 1))
    if messages is not None:
        for number, raws in messages.items():
            name, _, sub, _ = schema[number]
            assert sub is not None
            if len(raws) == 1:
                raw = raws[0]
                out[name] = _time(raw, depth + 1) if sub is TIME else decode(raw, sub, depth + 1)
            else:  # each must parse alone; merged, they are their concatenation parsed
                for raw in raws:
                    decode(raw, sub, depth + 1)
                out[name] = decode(b"".join(raws), sub, depth + 1)
    return out


# google.protobuf.Timestamp and Duration: (seconds int64 = 1, nanos int32 = 2).
TIME: Schema = {1: ("seconds", INT64, None, None), 2: ("nanos", INT32, None, None)}


def _time(raw: bytes, depth: int) -> dict[str, Any]:
    """A Timestamp or Duration, as `decode(raw, TIME)` reads it, for the usual layout (a
    seconds varint then a nanos varint, each at most once); anything else through decode."""
    end = len(raw)
    if end and raw[0] == 0x08:
        seconds, pos = read_varint(raw, 1, end)
        if pos == end:
            return {"seconds": _int64(seconds)}
        if raw[pos] == 0x10:
            nanos, stop = read_varint(raw, pos + 1, end)
            if stop == end:
                return {"seconds": _int64(seconds), "nanos": _int32(nanos)}
    return decode(raw, TIME, depth)


def _skip_unknown(buf: bytes, pos: int, end: int, tag: int, depth: int) -> int:
    """The position after the unknown field whose tag ends before `pos`."""
    number, wire = tag >> 3, tag & 7
    if number == 0:
        raise DecodeError("field number 0")
    if number > MAX_FIELD_NUMBER:
        raise DecodeError("field number too large")
    if wire == SGROUP:
        return _skip_group(buf, pos, end, number, depth)
    if wire == EGROUP:
        raise DecodeError("end-group tag outside a group")
    return _skip_value(buf, pos, end, wire)
