"""Per-job enqueue rejections: values, not errors. The base class is here; the one class per
server reason lives in `_rejection_reasons.py`, imported when first needed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard


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
