"""`HandlerError`'s outcome is public and typed: `directive` is a `sepp.Retry`, `reason` a
str, both read-only (test_typing.py: the lines mypy must refuse carry `# type: ignore[code]`)."""

from __future__ import annotations

from datetime import timedelta

import sepp


async def middleware(job: sepp.Job, call_next: sepp.CallNext) -> None:
    try:
        await call_next()
    except sepp.HandlerError as exc:
        directive: sepp.Retry = exc.directive
        reason: str = exc.reason
        delay: timedelta | None = directive.delay
        permanent: bool = directive == sepp.Retry.DEAD_LETTER or directive.kind == "dead_letter"
        print(reason, delay, permanent)
        exc.directive = sepp.Retry.DEFAULT  # type: ignore[misc]
        raise
