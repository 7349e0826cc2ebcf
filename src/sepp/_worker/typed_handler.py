"""Registration-time work on a handler: check that it takes `(payload, ctx)`, and, when its
first parameter names a model type (or it is registered for a Task), wrap it in an adapter that
decodes the payload into that type before the call. A payload that does not decode becomes a
PoisonPayload: a HandlerError that dead-letters the job (or retries it, if so configured)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._model.settlement import HandlerError, OnInvalid
from .._model.types import JobContext, Payload, Retry

if TYPE_CHECKING:  # imported when a handler names a model type: untyped ones never need them
    from .._payloads.codecs import PayloadCodec
    from .._payloads.task import Task

EXPECTED_SHAPE = "(payload, ctx)"


class PoisonPayload(HandlerError):
    """A job's payload does not decode into its handler's type."""


def _signature(fn: Callable[..., Any]) -> tuple[inspect.Signature | None, Exception | None]:
    """`fn`'s signature, with its annotations evaluated if they can be (else left as
    strings, and the error that stopped them)."""
    try:
        return inspect.signature(fn, eval_str=True), None
    except (TypeError, ValueError):
        return None, None  # a builtin or C callable without a signature: trusted
    except Exception as exc:  # NameError: a name imported only under TYPE_CHECKING, ...
        return unevaluated_signature(fn), exc


def unevaluated_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """`fn`'s signature without evaluating its annotations: those written as code come back
    as their source text. Before 3.14 annotations are evaluated when `fn` is defined (or are
    strings already); from 3.14 (PEP 649) they are evaluated on request, so a name imported
    only under TYPE_CHECKING, or a class defined after a decorator ran, raises NameError
    unless asked for as strings."""
    if sys.version_info >= (3, 14):
        from annotationlib import Format

        return inspect.signature(fn, annotation_format=Format.STRING)
    return inspect.signature(fn)


def _first_parameter(fn: Callable[..., Any], where: str) -> tuple[inspect.Parameter | None, str]:
    """`fn`'s first positional parameter once `fn` is known to accept `(payload, ctx)`, and
    why its annotation could not be evaluated ("" if it could)."""
    signature, unresolved = _signature(fn)
    if signature is None:
        return None, ""
    params = list(signature.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    keyword_only = [
        p.name
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ]
    if len(required) > 2 or (len(positional) < 2 and not varargs) or keyword_only:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise TypeError(
            f"{where}: a handler is called as handler{EXPECTED_SHAPE} with the decoded payload"
            f" (or the sepp.Payload) and the sepp.JobContext; {name}{signature} cannot take that"
        )
    return (positional[0] if positional else None), str(unresolved or "")


_RAW = (Payload, Payload | None, Any, object)  # Optional[Payload] == Payload | None


def _first_parameter_type(fn: Callable[..., Any], where: str) -> object | None:
    """The type `fn`'s first parameter is annotated with; None when it wants the raw Payload
    (no annotation, `sepp.Payload`, `sepp.Payload | None`, Any or object)."""
    param, unresolved = _first_parameter(fn, where)
    if param is None or param.annotation is inspect.Parameter.empty:
        return None
    annotation = param.annotation
    if isinstance(annotation, str):
        if _raw_annotation(annotation):
            return None
        raise TypeError(
            f"{where}: cannot resolve the annotation {annotation!r} of the handler's first"
            f" parameter ({unresolved}); import the type at module level, or use Router.task"
        )
    if annotation in _RAW:
        return None
    return annotation  # type: ignore[no-any-return]


def _adapter(
    fn: Callable[..., Any],
    into: object,
    codec: PayloadCodec,
    what: str,
    on_invalid: OnInvalid,
) -> Callable[[Payload | None, JobContext], Any]:
    """`fn` behind a decoder: sync stays sync (a worker may run it in a thread)."""
    from .._payloads.codecs import PayloadDecodeError, type_name
    from .thread_handlers import is_async_callable

    decode = codec.decode
    directive = Retry.DEAD_LETTER if on_invalid == "dead_letter" else Retry.DEFAULT

    def poison(error: PayloadDecodeError) -> PoisonPayload:
        reason = f"{what}: payload does not decode into {type_name(into)}: {error.error}"
        return PoisonPayload(reason, directive)

    if is_async_callable(fn):

        async def decoded(payload: Payload | None, ctx: JobContext) -> Any:
            try:
                value: Any = decode(payload, into)  # type: ignore[arg-type]
            except PayloadDecodeError as exc:
                raise poison(exc) from None
            return await fn(value, ctx)

    else:

        def decoded(payload: Payload | None, ctx: JobContext) -> Any:  # type: ignore[misc]
            try:
                value: Any = decode(payload, into)  # type: ignore[arg-type]
            except PayloadDecodeError as exc:
                raise poison(exc) from None
            return fn(value, ctx)

    decoded.__qualname__ = getattr(fn, "__qualname__", decoded.__qualname__)
    decoded.__wrapped__ = fn  # type: ignore[attr-defined]
    return decoded


def prepare(
    fn: Callable[..., Any], job_type: str | None, on_invalid: OnInvalid
) -> Callable[[Payload | None, JobContext], Any]:
    """`fn` checked, and wrapped in a decoder if its first parameter names a model type."""
    where = f"handler for {job_type!r}" if job_type is not None else "catch-all handler"
    into = _first_parameter_type(fn, where)
    if into is None:
        return fn
    from .._payloads.codecs import codec_for

    codec = codec_for(into)
    _probe(codec, into, where)
    return _adapter(fn, into, codec, f"job type {job_type!r}", on_invalid)


def prepare_for_task(fn: Callable[..., Any], task: Task[Any]) -> Callable[..., Any]:
    """`fn` checked against `task`'s payload type, and wrapped in the task's decoder. The task
    says the type: an annotation is compared with it where it resolves, and by name where it
    does not (a model defined in a function, under `from __future__ import annotations`)."""
    from .._payloads.codecs import type_name

    where = f"handler for task {task.job_type!r}"
    param, _ = _first_parameter(fn, where)
    annotation = inspect.Parameter.empty if param is None else param.annotation
    if isinstance(annotation, str):
        if not _names_the_type(annotation, task.payload_type):
            raise TypeError(
                f"{where}: its first parameter is annotated {annotation!r}, but the task's"
                f" payloads are {type_name(task.payload_type)}"
            )
    elif annotation is not inspect.Parameter.empty and annotation not in _RAW:
        if annotation != task.payload_type:
            raise TypeError(
                f"{where}: its first parameter is annotated {type_name(annotation)}, but the"
                f" task's payloads are {type_name(task.payload_type)}"
            )
    _probe(task.codec, task.payload_type, where)
    adapter = _adapter(
        fn, task.payload_type, task.codec, f"task {task.job_type!r}", task.on_invalid
    )
    adapter.sepp_encode_result = task.encode_result  # type: ignore[attr-defined]  # (Route's)
    return adapter


def _names_the_type(annotation: str, payload_type: object) -> bool:
    """Whether an annotation left as a string can mean `payload_type`: a raw-payload one, the
    type's name or qualified name (with or without a module in front), or, for a payload type
    that is not a class (`list[Line]`, a union), anything (it cannot be told by name)."""
    text = annotation.strip().strip("'\"")
    if _raw_annotation(text):
        return True
    if not isinstance(payload_type, type) or getattr(payload_type, "__args__", None):
        return True  # 3.10 counts list[Line] as a type
    names = {payload_type.__name__, payload_type.__qualname__}
    return text in names or any(text.endswith("." + name) for name in names)


def _raw_annotation(text: str) -> bool:
    return "Payload" in text or text in ("Any", "object", "typing.Any")


def _probe(codec: PayloadCodec, into: object, where: str) -> None:
    """Compile the JSON codec's decoder now, so an unsupported type fails at registration."""
    from .._payloads.codecs import JsonCodec
    from .._payloads.json_decoders import compile_decoder

    if isinstance(codec, JsonCodec):
        try:
            compile_decoder(into)
        except TypeError as exc:
            raise TypeError(f"{where}: {exc}") from None
