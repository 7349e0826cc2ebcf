"""The JSON codec's machinery: a decoder compiled once per type (parsed JSON → typed object,
checking as it builds), and the encoder for the types it knows."""

from __future__ import annotations

import dataclasses
import enum
import functools
import threading
import types
import typing
import uuid
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any, Union

if typing.TYPE_CHECKING:
    import json

Decoder = Callable[[Any], Any]


class Invalid(ValueError):
    """Where in the document (built as the error unwinds) and what is wrong."""

    def __init__(self, problem: str, path: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.path = path

    def at(self, step: str) -> Invalid:
        return Invalid(self.problem, step + self.path)

    def __str__(self) -> str:
        return f"${self.path}: {self.problem}"


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "bool"}.get(
        type(value), type(value).__name__
    )


def _expected(what: str, value: object) -> Invalid:
    return Invalid(f"expected {what}, got {_kind(value)}")


# -- scalars ---------------------------------------------------------------------------------


def _any(value: Any) -> Any:
    return value


# Decoders of exact types, whose check record decoders inline: decoder → (type, what).
_EXACT_TYPES: dict[Decoder, tuple[type, str]] = {}


def _exact(tp: type, what: str) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is tp:
            return value
        raise _expected(what, value)

    _EXACT_TYPES[decode] = (tp, what)
    return decode


def _float(value: Any) -> float:
    kind = type(value)
    if kind is float:
        return value  # type: ignore[no-any-return]
    if kind is int:
        return float(value)
    raise _expected("number", value)


def _none(value: Any) -> None:
    if value is not None:
        raise _expected("null", value)


def _from_string(parse: Callable[[str], Any], what: str) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not str:
            raise _expected(what, value)
        try:
            return parse(value)
        except ValueError:
            raise Invalid(f"expected {what}, got {value[:64]!r}") from None

    return decode


def _parse_datetime(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _decimal(value: Any) -> Decimal:
    kind = type(value)
    if kind is str or kind is int or kind is float:
        try:
            return Decimal(str(value))
        except InvalidOperation:
            pass
    raise _expected("a decimal number or string", value)


def _enum(cls: type[enum.Enum]) -> Decoder:
    members = {member.value: member for member in cls}

    def decode(value: Any) -> Any:
        try:
            return members[value]
        except (KeyError, TypeError):
            allowed = ", ".join(repr(v) for v in list(members)[:8])
            raise Invalid(f"expected one of {allowed}, got {value!r}"[:200]) from None

    return decode


def _literal(allowed: tuple[Any, ...]) -> Decoder:
    def decode(value: Any) -> Any:
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        raise Invalid(f"expected one of {', '.join(map(repr, allowed))}, got {value!r}"[:200])

    return decode


_SCALARS: dict[object, Decoder] = {
    Any: _any,
    object: _any,
    str: _exact(str, "string"),
    int: _exact(int, "integer"),
    bool: _exact(bool, "bool"),
    float: _float,
    type(None): _none,
    None: _none,
    datetime: _from_string(_parse_datetime, "an ISO 8601 date-time"),
    date: _from_string(date.fromisoformat, "an ISO 8601 date"),
    time: _from_string(time.fromisoformat, "an ISO 8601 time"),
    uuid.UUID: _from_string(uuid.UUID, "a UUID"),
    Decimal: _decimal,
}


# -- containers ------------------------------------------------------------------------------


def _sequence(item: Decoder, build: Callable[[list[Any]], Any]) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not list:
            raise _expected("array", value)
        out = []
        for index, element in enumerate(value):
            try:
                out.append(item(element))
            except Invalid as exc:
                raise exc.at(f"[{index}]") from None
        return out if build is list else build(out)

    return decode


def _fixed_tuple(items: list[Decoder]) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not list:
            raise _expected("array", value)
        if len(value) != len(items):
            raise Invalid(f"expected {len(items)} items, got {len(value)}")
        out = []
        for index, (item, element) in enumerate(zip(items, value, strict=True)):
            try:
                out.append(item(element))
            except Invalid as exc:
                raise exc.at(f"[{index}]") from None
        return tuple(out)

    return decode


def _key_decoder(tp: object) -> Decoder:
    """JSON object keys are strings: parse them into `tp`."""
    if tp is str or tp is Any:
        return _any
    if tp is int:
        return _from_string(int, "an integer key")
    value_decoder = compile_decoder(tp)

    def decode(key: str) -> Any:
        return value_decoder(key)

    return decode


def _mapping(key: Decoder, item: Decoder) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not dict:
            raise _expected("object", value)
        out = {}
        for name, element in value.items():
            try:
                out[key(name)] = item(element)
            except Invalid as exc:
                raise exc.at(f"[{name!r}]") from None
        return out

    return decode


def _union(options: list[Decoder], names: str) -> Decoder:
    if len(options) == 2 and _none in options:  # Optional[X]: the common case, made cheap
        other = options[0] if options[1] is _none else options[1]

        def optional(value: Any) -> Any:
            return None if value is None else other(value)

        return optional

    def decode(value: Any) -> Any:
        for option in options:
            try:
                return option(value)
            except Invalid:
                continue
        raise _expected(names, value)

    return decode


# -- records ---------------------------------------------------------------------------------


_MISSING = object()


def _fields_decoder(fields: list[tuple[str, Decoder, bool]], build: Callable[..., Any]) -> Decoder:
    """An object → `build(**kwargs)`, for each (name, decoder, required). The decoder is
    generated source, one straight run of lookups per field, since this is the per-job path:
    names enter it only as string literals (repr), decoders only by reference."""
    namespace: dict[str, Any] = {
        "Invalid": Invalid,
        "_expected": _expected,
        "_MISSING": _MISSING,
        "build": build,
    }
    lines = [
        "def decode(value):",
        "    if type(value) is not dict:",
        "        raise _expected('object', value)",
        "    get = value.get",
        "    kwargs = {}",
    ]
    for index, (name, decoder, required) in enumerate(fields):
        key, place = repr(name), repr(f".{name}")
        lines.append(f"    v = get({key}, _MISSING)")
        if required:
            missing = repr(f"missing required field {name!r}")
            lines += ["    if v is _MISSING:", f"        raise Invalid({missing})"]
            pad = "    "
        else:
            lines.append("    if v is not _MISSING:")
            pad = "        "
        exact = _EXACT_TYPES.get(decoder)
        if decoder is _any:
            lines.append(f"{pad}kwargs[{key}] = v")
        elif exact is not None:  # str, int, bool: the check inline, no call
            namespace[f"t{index}"] = exact[0]
            lines += [
                f"{pad}if type(v) is not t{index}:",
                f"{pad}    raise _expected({exact[1]!r}, v).at({place})",
                f"{pad}kwargs[{key}] = v",
            ]
        else:
            namespace[f"d{index}"] = decoder
            lines += [
                f"{pad}try:",
                f"{pad}    kwargs[{key}] = d{index}(v)",
                f"{pad}except Invalid as exc:",
                f"{pad}    raise exc.at({place}) from None",
            ]
    lines.append("    return build(**kwargs)")
    exec("\n".join(lines), namespace)  # our own source, see above
    decode: Decoder = namespace["decode"]
    return decode


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as exc:  # NameError for a name only imported under TYPE_CHECKING, ...
        raise TypeError(f"cannot resolve the type hints of {cls.__qualname__}: {exc}") from exc


def _dataclass(cls: type) -> Decoder:
    hints = _hints(cls)
    fields = [
        (
            field.name,
            compile_decoder(hints[field.name]),
            field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING,
        )
        for field in dataclasses.fields(cls)
        if field.init
    ]
    return _fields_decoder(fields, cls)


def _typed_dict(cls: type) -> Decoder:
    hints = _hints(cls)
    required: frozenset[str] = getattr(cls, "__required_keys__", frozenset(hints))
    fields = [(name, compile_decoder(tp), name in required) for name, tp in hints.items()]
    return _fields_decoder(fields, dict)


# -- compiling -------------------------------------------------------------------------------


def _is_typed_dict(tp: object) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


@functools.cache
def _compile_cached(tp: object) -> Decoder:
    return _compile(tp)


# Types being compiled: a recursive reference gets a stand-in that looks the result up later.
_in_progress: dict[object, list[Decoder]] = {}
_compiling = threading.RLock()


def compile_decoder(tp: object) -> Decoder:
    """A decoder for `tp` (cached): parsed JSON in, a `tp` out, or Invalid naming the place."""
    if not _hashable(tp):  # e.g. Annotated with a dict in its metadata: not cached
        with _compiling:
            return _compile(tp)
    with _compiling:  # the recursion bookkeeping is global; workers may register from threads
        cell = _in_progress.get(tp)
        if cell is not None:
            found = cell

            def later(value: Any) -> Any:
                return found[0](value)

            return later
        return _compile_cached(tp)


def _compile(tp: object) -> Decoder:
    scalar = _SCALARS.get(tp) if _hashable(tp) else None
    if scalar is not None:
        return scalar
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return compile_decoder(args[0])
    if origin is Union or origin is types.UnionType:
        options = [compile_decoder(arg) for arg in args]
        return _union(options, " or ".join(_describe(arg) for arg in args))
    if origin is typing.Literal:
        return _literal(args)
    if origin in (list, set, frozenset) or (
        origin is not None and _named(origin, "collections.abc", ("Sequence", "Set"))
    ):
        item = compile_decoder(args[0] if args else Any)
        return _sequence(item, {set: set, frozenset: frozenset}.get(origin, list))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _sequence(compile_decoder(args[0]), tuple)
        return _fixed_tuple([compile_decoder(arg) for arg in args])
    if origin is dict or (origin is not None and _named(origin, "collections.abc", ("Mapping",))):
        key, value = args if args else (str, Any)
        return _mapping(_key_decoder(key), compile_decoder(value))
    if tp is dict:
        return compile_decoder(dict[str, Any])
    if tp is tuple:
        return compile_decoder(tuple[Any, ...])
    if tp in (list, set, frozenset):
        return compile_decoder(tp[Any])
    supertype = getattr(tp, "__supertype__", None)  # typing.NewType
    if supertype is not None:
        return compile_decoder(supertype)
    if not isinstance(tp, type):
        raise TypeError(f"the JSON codec cannot decode {tp!r}")
    if issubclass(tp, enum.Enum):
        return _enum(tp)
    cell: list[Decoder] = []
    _in_progress[tp] = cell
    try:
        if dataclasses.is_dataclass(tp):
            decoder = _dataclass(tp)
        elif _is_typed_dict(tp):
            decoder = _typed_dict(tp)
        else:
            raise TypeError(
                f"the JSON codec cannot decode {tp.__qualname__}: use a dataclass, TypedDict,"
                " enum, datetime, date, UUID, Decimal, a builtin, or a container of these, or"
                " give the task a codec that knows it"
            )
    finally:
        del _in_progress[tp]
    cell.append(decoder)
    return decoder


def _hashable(tp: object) -> bool:
    try:
        hash(tp)
    except TypeError:
        return False
    return True


def _named(origin: object, module: str, names: tuple[str, ...]) -> bool:
    named = getattr(origin, "__name__", "")
    return getattr(origin, "__module__", None) == module and named in names


def _describe(tp: object) -> str:
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", None) or repr(tp)


# -- encoding --------------------------------------------------------------------------------


def _default(value: Any) -> Any:
    """What json cannot write itself; nested values come back here as json meets them."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, Decimal)):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


@functools.lru_cache(maxsize=1)
def encoder() -> json.JSONEncoder:
    import json

    # allow_nan=False: NaN and Infinity are not JSON, and other clients cannot read them.
    return json.JSONEncoder(
        separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default
    )
