"""The `limit=` of a registration and of a Router, checked: which `sepp.Limit`s a handler's
jobs pass, and which of them are one and the same limit.

A handler's own limit is named after its job type when it has no name (a second unnamed one
in its list `<job type>.2`, and so on); limits with one name
are one limit (in a Worker, and for `scope="global"` across every process), so the same
name with other values is refused. A Router's own limit is one limit for all of its handlers:
named, or else that Router's alone (a global one must be named: every process must agree)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .._limits.limit import Limit
from .._model.errors import ValidationError

LimitSetting = Limit | Iterable[Limit] | None
"""What `limit=` takes: a `sepp.Limit`, several (each must admit the job), or None."""


class LimitUse(NamedTuple):
    """One limit a handler's jobs pass: `limit` (a handler's own named after its job type),
    and `router`, the Router it is the one limit of when it has no name (else None: the name
    says which limit it is)."""

    limit: Limit
    router: object | None = None

    @property
    def identity(self) -> object:
        """What makes two uses one limit: the name, or the Router."""
        return self.limit.name if self.router is None else self.router

    @property
    def label(self) -> str:
        """The name logs and metrics show (an unnamed Router limit: shown by its handlers)."""
        return self.limit.name or "router"


def checked_limits(
    field: str, limit: object, *, job_type: str | None = None, router: object = None
) -> tuple[LimitUse, ...]:
    """`limit=` as uses: a registration's (`job_type`: the default name) or a Router's."""
    if limit is None:
        return ()
    items = [limit] if isinstance(limit, Limit) else _listed(field, limit)
    uses = []
    unnamed = 0
    for index, item in enumerate(items):
        where = field if isinstance(limit, Limit) else f"{field}[{index}]"
        if not isinstance(item, Limit):
            raise ValidationError(where, f"must be a sepp.Limit, got {type(item).__name__}")
        if job_type is not None:
            if item.name is None:
                unnamed += 1
            default = job_type if unnamed <= 1 else f"{job_type}.{unnamed}"
            uses.append(LimitUse(item.named(default)))
        elif item.name is not None:
            uses.append(LimitUse(item))
        elif item.is_global:
            raise ValidationError(
                where,
                "a global limit on a Router needs name=: it is what every process sharing"
                " the limit agrees on",
            )
        else:
            uses.append(LimitUse(item, router))
    check_one_value_per_name(uses)
    return tuple(uses)


def _listed(field: str, limit: object) -> list[object]:
    if isinstance(limit, (str, bytes)) or not isinstance(limit, Iterable):
        raise ValidationError(field, f"must be a sepp.Limit or a list of them, got {limit!r}")
    return list(limit)


def check_one_value_per_name(uses: Iterable[LimitUse]) -> None:
    """One name, one limit: the same name with other values is refused (its key function may
    differ: each use keys its own jobs)."""
    seen: dict[object, Limit] = {}
    for use in uses:
        limit = use.limit
        other = seen.setdefault(use.identity, limit)
        if other is not limit and _values(other) != _values(limit):
            raise ValidationError(
                "limit",
                f"the limit {limit.name!r} is given twice with different values: {other!r} and"
                f" {limit!r} (one name is one limit)",
            )


def _values(limit: Limit) -> tuple[object, ...]:
    return (limit.concurrency, limit.rate, limit.per, limit.scope, limit.lease)
