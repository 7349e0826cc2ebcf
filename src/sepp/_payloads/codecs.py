"""Payload codecs: objects to `Payload`s and back. One small protocol; the JSON codec needs no
extra dependency, and pydantic / msgspec models get codecs of their own when those libraries
are in use (they are never imported here unless a model of theirs is already loaded)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

from .._model.errors import SeppError, ValidationError
from .._model.types import JSON_ENCODING, Payload
from .json_decoders import Invalid, compile_decoder, encoder

T = TypeVar("T")

MSGPACK_ENCODING = "application/msgpack"
_MSGPACK_ALIASES = frozenset({MSGPACK_ENCODING, "application/x-msgpack", "application/vnd.msgpack"})


class PayloadDecodeError(SeppError, ValueError):
    """A payload does not decode into `into`: `error` is the first problem found (with its
    place in the document, e.g. `$.items[2].sku: expected str, got int`)."""

    def __init__(self, into: object, error: str) -> None:
        self.into = into
        self.error = error
        super().__init__(f"payload does not decode into {type_name(into)}: {error}")


@runtime_checkable
class PayloadCodec(Protocol):
    """Encodes objects into payloads and decodes payloads into a given type. `decode` raises
    PayloadDecodeError for a payload that does not fit (bad bytes, wrong encoding label,
    missing field, wrong type); a job without a payload arrives as `payload=None`. `encode`
    raises ValidationError (field "payload") for a value it cannot encode; a Task turns any
    other error of a codec's `encode` into one."""

    def encode(self, value: Any) -> Payload:
        """`value` as a Payload (data and encoding label)."""
        ...

    def decode(self, payload: Payload | None, into: type[T]) -> T:
        """`payload` as an `into`; raises PayloadDecodeError if it does not fit."""
        ...


def type_name(tp: object) -> str:
    name = getattr(tp, "__qualname__", None)
    return name if isinstance(name, str) and not getattr(tp, "__args__", None) else repr(tp)


def _is_json(encoding: str) -> bool:
    media = encoding.partition(";")[0].strip().lower()
    return media == JSON_ENCODING or media.endswith("+json")


def _json_document(payload: Payload | None, into: object) -> Any:
    """The parsed JSON of `payload` (None for a job without one)."""
    import json

    if payload is None:
        return None
    if not _is_json(payload.encoding):
        raise PayloadDecodeError(into, f"encoding {payload.encoding!r} is not JSON")
    try:
        return json.loads(payload.data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise PayloadDecodeError(into, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise PayloadDecodeError(into, "not valid JSON: nested too deeply") from None


class JsonCodec:
    """The default codec: JSON for dataclasses (nested, optional fields, defaults),
    `TypedDict`s, enums, `datetime`/`date`/`time` (ISO 8601), `UUID`, `Decimal` (as a string),
    and lists, tuples, sets and dicts of these, with no dependency. A decoder is compiled once
    per type. Unknown object keys are ignored, so older workers accept newer producers'
    payloads."""

    __slots__ = ("_decoders",)

    def __init__(self) -> None:
        self._decoders: dict[object, Callable[[Any], Any]] = {}

    def encode(self, value: Any) -> Payload:
        """`value` as compact UTF-8 JSON labelled `application/json`."""
        try:
            text = encoder().encode(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValidationError("payload", f"not JSON-serialisable: {exc}") from exc
        return Payload(text.encode("utf-8"), JSON_ENCODING)

    def decode(self, payload: Payload | None, into: type[T]) -> T:
        """`payload` parsed and checked against `into`; raises PayloadDecodeError."""
        try:
            decoder = self._decoders[into]
        except KeyError:
            decoder = self._decoders[into] = compile_decoder(into)
        except TypeError:  # an unhashable type form (Annotated with a dict): not cached
            decoder = compile_decoder(into)
        document = _json_document(payload, into)
        if document is None and payload is None:
            try:
                return decoder(None)  # type: ignore[no-any-return]
            except Invalid:
                raise PayloadDecodeError(into, "the job has no payload") from None
        try:
            return decoder(document)  # type: ignore[no-any-return]
        except Invalid as exc:
            raise PayloadDecodeError(into, str(exc)) from None
        except RecursionError:  # a recursive type, and a document nested deeper than Python
            raise PayloadDecodeError(into, "nested too deeply") from None

    def __repr__(self) -> str:
        return "sepp.JsonCodec()"


class PydanticCodec:
    """pydantic v2 models: validated with `model_validate_json`, encoded with
    `model_dump_json`. Chosen for a pydantic model unless a task names another codec."""

    __slots__ = ()

    def encode(self, value: Any) -> Payload:
        """`value.model_dump_json()` labelled `application/json`; ValidationError (field
        "payload", pydantic's error as its cause) for anything else or a value pydantic
        cannot serialise."""
        if not _subclass_of(type(value), "pydantic", "BaseModel"):
            raise ValidationError(
                "payload", f"must be a pydantic model, got {type(value).__qualname__}"
            )
        try:
            text: str = value.model_dump_json()
        except Exception as exc:  # PydanticSerializationError, or a serialiser's own error
            raise ValidationError("payload", f"pydantic cannot serialise it: {exc}") from exc
        return Payload(text.encode("utf-8"), JSON_ENCODING)

    def decode(self, payload: Payload | None, into: type[T]) -> T:
        """`into.model_validate_json(...)`; the first validation error names the field."""
        pydantic = sys.modules["pydantic"]  # loaded: `into` is one of its models
        if payload is None:
            raise PayloadDecodeError(into, "the job has no payload")
        if not _is_json(payload.encoding):
            raise PayloadDecodeError(into, f"encoding {payload.encoding!r} is not JSON")
        try:
            return into.model_validate_json(payload.data)  # type: ignore[attr-defined,no-any-return]
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            place = ".".join(str(part) for part in first.get("loc", ())) or "$"
            raise PayloadDecodeError(into, f"{place}: {first.get('msg')}") from None

    def __repr__(self) -> str:
        return "sepp.PydanticCodec()"


class MsgspecCodec:
    """msgspec `Struct`s (and any type msgspec knows), encoded as JSON or, with
    `format="msgpack"`, MessagePack labelled `application/msgpack`. Either is decoded, by the
    payload's label. Chosen (JSON) for a Struct unless a task names another codec."""

    __slots__ = ("_decoders", "_format")

    FORMATS: ClassVar[tuple[str, ...]] = ("json", "msgpack")

    def __init__(self, format: Literal["json", "msgpack"] = "json") -> None:
        if format not in self.FORMATS:
            raise ValueError(f"format must be 'json' or 'msgpack', got {format!r}")
        self._format = format
        self._decoders: dict[tuple[object, bool], Any] = {}

    @property
    def format(self) -> str:
        """The format `encode` writes: "json" or "msgpack"."""
        return self._format

    def encode(self, value: Any) -> Payload:
        """`value` encoded by msgspec in this codec's format; ValidationError (field "payload",
        msgspec's error as its cause) if it cannot be."""
        import msgspec

        packed = self._format == "msgpack"
        try:
            data = msgspec.msgpack.encode(value) if packed else msgspec.json.encode(value)
        except Exception as exc:  # TypeError, OverflowError, msgspec.EncodeError, ...
            raise ValidationError("payload", f"msgspec cannot encode it: {exc}") from exc
        return Payload(data, MSGPACK_ENCODING if packed else JSON_ENCODING)

    def decode(self, payload: Payload | None, into: type[T]) -> T:
        """`payload` decoded by msgspec into `into` (JSON or MessagePack, by its label)."""
        import msgspec

        if payload is None:
            raise PayloadDecodeError(into, "the job has no payload")
        media = payload.encoding.partition(";")[0].strip().lower()
        packed = media in _MSGPACK_ALIASES
        if not packed and not _is_json(media):
            raise PayloadDecodeError(
                into, f"encoding {payload.encoding!r} is neither JSON nor MessagePack"
            )
        decoder = self._decoders.get((into, packed))
        if decoder is None:
            module = msgspec.msgpack if packed else msgspec.json
            decoder = self._decoders[(into, packed)] = module.Decoder(into)
        try:
            return decoder.decode(payload.data)  # type: ignore[no-any-return]
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise PayloadDecodeError(into, str(exc)) from None

    def __repr__(self) -> str:
        return f"sepp.MsgspecCodec({self._format!r})"


DEFAULT_JSON = JsonCodec()
_PYDANTIC = PydanticCodec()
_MSGSPEC = MsgspecCodec()


def _subclass_of(tp: object, module: str, name: str) -> bool:
    # Only when the library is already loaded: a class of theirs cannot exist otherwise.
    loaded = sys.modules.get(module)
    base = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(base, type) and isinstance(tp, type) and issubclass(tp, base)


def codec_for(tp: object) -> PayloadCodec:
    """The codec a type gets unless told otherwise: pydantic's for its models, msgspec's (JSON)
    for its Structs, else the JSON codec."""
    if _subclass_of(tp, "pydantic", "BaseModel"):
        return _PYDANTIC
    if _subclass_of(tp, "msgspec", "Struct"):
        return _MSGSPEC
    return DEFAULT_JSON
