"""Per-job enqueue rejections: values, not errors. One class per server reason; those live in
`_rejection_reasons.py`, imported when first used (PEP 562 `__getattr__` below)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    from ._rejection_reasons import CustomEntriesTooMany as CustomEntriesTooMany
    from ._rejection_reasons import CustomKeyTooLong as CustomKeyTooLong
    from ._rejection_reasons import CustomMapTooLarge as CustomMapTooLarge
    from ._rejection_reasons import EncodingNotAllowed as EncodingNotAllowed
    from ._rejection_reasons import IdempotencyKeyTooLong as IdempotencyKeyTooLong
    from ._rejection_reasons import InvalidRequest as InvalidRequest
    from ._rejection_reasons import JobTypeNameTooLong as JobTypeNameTooLong
    from ._rejection_reasons import JobTypeNotAllowed as JobTypeNotAllowed
    from ._rejection_reasons import PayloadTooLarge as PayloadTooLarge
    from ._rejection_reasons import QueueClosing as QueueClosing
    from ._rejection_reasons import QueueFull as QueueFull
    from ._rejection_reasons import QueueNameTooLong as QueueNameTooLong
    from ._rejection_reasons import ScheduledTooFar as ScheduledTooFar
    from ._rejection_reasons import UnknownQueue as UnknownQueue
    from ._rejection_reasons import UnknownRejection as UnknownRejection


@dataclass(frozen=True, slots=True)
class JobRejection:
    """Base of every rejection the server can return for one job."""

    @property
    def retryable(self) -> bool:
        """Whether the same job may succeed later unchanged (QueueFull, QueueClosing)."""
        return False


@dataclass(frozen=True, slots=True)
class BatchRejection:
    """One offending job of a refused atomic batch."""

    index: int
    rejection: JobRejection


def is_job_rejection(value: object) -> TypeGuard[JobRejection]:
    """True for any rejection value (as found in `enqueue_batch` results)."""
    return isinstance(value, JobRejection)


def describe_job_rejection(rejection: JobRejection) -> str:
    """A one-line, human-readable explanation of a rejection."""
    from ._rejection_reasons import describe

    return describe(rejection)


_REASONS = frozenset(
    {
        "UnknownQueue",
        "PayloadTooLarge",
        "EncodingNotAllowed",
        "JobTypeNotAllowed",
        "CustomEntriesTooMany",
        "CustomMapTooLarge",
        "CustomKeyTooLong",
        "QueueNameTooLong",
        "JobTypeNameTooLong",
        "IdempotencyKeyTooLong",
        "ScheduledTooFar",
        "InvalidRequest",
        "QueueFull",
        "QueueClosing",
        "UnknownRejection",
    }
)

if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        if name not in _REASONS:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from . import _rejection_reasons

        value = getattr(_rejection_reasons, name)
        globals()[name] = value
        return value
