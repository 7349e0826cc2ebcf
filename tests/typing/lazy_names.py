"""Names `sepp` imports on first use type-check like the rest, and a misspelt name is still an
error: the module `__getattr__` is hidden from type checkers (test_typing.py)."""

from __future__ import annotations

from typing import assert_type

import sepp
from sepp import QueueFull, Worker


def lazy_names(router: sepp.Router) -> None:
    assert_type(sepp.Worker, type[Worker])
    assert_type(sepp.QueueFull("q", 1), QueueFull)
    assert_type(sepp.QueueFull("q", 1).limit, int)
    assert_type(sepp.describe_job_rejection(sepp.QueueClosing("q")), str)
    assert_type(sepp.Schedule().every("tick", 60, "q", "t"), sepp.Schedule)
    rejection: sepp.JobRejection = sepp.UnknownRejection()
    assert rejection

    _ = sepp.Wroker  # type: ignore[attr-defined]
    _ = sepp.QueueFul  # type: ignore[attr-defined]
