"""Failure policy by exception: which exceptions of a handler retry its job and which
dead-letter it at once (`retry_on`, `give_up_on` on a registration, a Router or the Worker),
checked where they are given and decided once per failed job."""

from __future__ import annotations

from typing import NamedTuple

from .._model.errors import ValidationError
from .._model.settlement import HandlerError

ExceptionTypes = tuple[type[Exception], ...]


def checked_exception_types(field: str, value: object) -> ExceptionTypes | None:
    """`value` (None: not set, an exception class, or a tuple or list of them) as a tuple,
    each one checked: a class of `Exception` (cancellation, KeyboardInterrupt and SystemExit
    never fail a job: they stop the worker), and not a `sepp.HandlerError` (which keeps its
    meaning whatever the policy says)."""
    if value is None:
        return None
    if isinstance(value, type):
        items: tuple[object, ...] = (value,)
    elif isinstance(value, (tuple, list, frozenset, set)):
        items = tuple(value)
    else:
        raise ValidationError(
            field, f"must be an exception class or a tuple of them, got {type(value).__name__}"
        )
    for index, item in enumerate(items):
        where = field if isinstance(value, type) else f"{field}[{index}]"
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ValidationError(where, f"must be an exception class, got {item!r}")
        if issubclass(item, HandlerError):
            raise ValidationError(
                where,
                f"{item.__qualname__} is a sepp.HandlerError, which keeps its meaning whatever"
                " the policy says (retry retries, permanent dead-letters): list other exceptions",
            )
        if not issubclass(item, Exception):
            raise ValidationError(
                where,
                f"{item.__qualname__} is not an Exception: cancellation (trio.Cancelled,"
                " asyncio.CancelledError), KeyboardInterrupt and SystemExit never fail a job,"
                " they stop the worker",
            )
    return items  # type: ignore[return-value]  # each checked above


class FailurePolicy(NamedTuple):
    """A route's `retry_on` and `give_up_on` (None: not set; `()` for `retry_on`: nothing
    retries)."""

    retry_on: ExceptionTypes | None
    give_up_on: ExceptionTypes | None

    def gives_up(self, error: Exception) -> str | None:
        """Why `error` (not a HandlerError's request) dead-letters its job at once, or None if
        it retries as any failure does. An exception group is matched as `except*` would:
        one leaf in `give_up_on` gives it up; with `retry_on`, every leaf must be in it."""
        if self.give_up_on:
            matched = _matching(error, self.give_up_on)
            if matched is not None:
                return f"{matched.__qualname__} is in give_up_on: not retried"
        if self.retry_on is not None and not _all_in(error, self.retry_on):
            listed = ", ".join(t.__qualname__ for t in self.retry_on) or "nothing"
            return f"not in retry_on ({listed}): not retried"
        return None


def _matching(error: Exception, types: ExceptionTypes) -> type[Exception] | None:
    """The first of `types` that `error`, or a leaf of it if it is a group, is an instance of."""
    for kind in types:
        if isinstance(error, kind):
            return kind
        if isinstance(error, BaseExceptionGroup) and error.split(kind)[0] is not None:
            return kind
    return None


def _all_in(error: Exception, types: ExceptionTypes) -> bool:
    """Whether `error` (every leaf of a group; its HandlerErrors aside) is one of `types`."""
    if isinstance(error, types):
        return True
    if not isinstance(error, BaseExceptionGroup):
        return False
    rest = error.split((*types, HandlerError))[1]
    return rest is None
