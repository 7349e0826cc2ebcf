"""`sepp.Limit`: how many handlers of a kind may run at once, and how often they may start."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from .._model import validate as v
from .._model.errors import ValidationError

if TYPE_CHECKING:
    from .._model.types import JobContext

Scope = Literal["worker", "global"]
KeyFunction = Callable[["JobContext"], object]

# Celery's spelling of a rate ("10/s", "100/m", "1000/h", "5/d"), and "N/<seconds>s" too.
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# A global limit's name is part of its queues' names, so it keeps to what reads well there.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
MAX_NAME_BYTES = 128
# Global permits are jobs made in one batch per limit and key (docs/limits.md, "Genesis").
MAX_GLOBAL_CONCURRENCY = 1024
MAX_GLOBAL_RATE = 1024
# A global rate's cooldown crosses at most one epoch boundary, and epochs stay well inside the
# server's default dedup window (24 h): docs/limits.md, "Epochs".
MAX_GLOBAL_PER_S = 6 * 3600.0
MAX_LOCAL = 1_000_000
DEFAULT_LEASE_S = 30.0


class Limit:
    """At most `concurrency` handlers running at once and at most `rate` handler starts in any
    window of `per` seconds, per key.

    - `concurrency`: how many handlers of what the limit is on may run at once.
    - `rate` starts per `per` seconds (default 1): no window of length `per` holds more than
      `rate` starts, so a burst of up to `rate` starts at once is allowed, and then a start
      each time one of them is `per` old (a token bucket of `rate` tokens, each back `per`
      after it was taken). Celery's spelling works too: `rate="10/s"` (also `/m`, `/h`, `/d`,
      and `"10/5s"`: 10 per 5 seconds).
    - `key`: a function of the job's `sepp.JobContext` (for example
      `lambda ctx: ctx.custom["tenant"]`); the limit holds for each key on its own (one sync
      per tenant). Without one, the limit holds for everything it is on together.
    - `scope`: `"worker"` (the default) holds the limit within one Worker process;
      `"global"` holds it across every Worker on every host that uses the same sepp server,
      with nothing but that server (docs/limits.md says how, and what it guarantees).
    - `name`: what identifies a global limit across processes (they must agree on it and on
      the values); given a handler, it defaults to the job type it is registered for.
    - `lease`: a global limit's permits are leased for this long and extended while held: a
      holder that is SIGKILLed, or cut off from the server, gives its share back within it.

    Durations are seconds (float) or `timedelta`. Bad values raise `sepp.ValidationError`.
    """

    __slots__ = ("concurrency", "key", "lease", "name", "per", "rate", "scope")

    concurrency: int | None
    rate: int | None
    per: float
    key: KeyFunction | None
    scope: Scope
    name: str | None
    lease: float

    def __init__(
        self,
        *,
        concurrency: int | None = None,
        rate: int | str | None = None,
        per: float | timedelta | None = None,
        key: KeyFunction | None = None,
        scope: Scope = "worker",
        name: str | None = None,
        lease: float | timedelta = DEFAULT_LEASE_S,
    ) -> None:
        if scope not in ("worker", "global"):
            raise ValidationError("scope", f'must be "worker" or "global", got {scope!r}')
        is_global = scope == "global"
        rate_n, per_s = _rate_and_per(rate, per)
        if concurrency is None and rate_n is None:
            raise ValidationError("concurrency", "a Limit needs concurrency=, rate= or both")
        if concurrency is not None:
            ceiling = MAX_GLOBAL_CONCURRENCY if is_global else MAX_LOCAL
            v.whole_number("concurrency", concurrency, low=1, high=ceiling)
        if rate_n is not None:
            v.whole_number("rate", rate_n, low=1, high=MAX_GLOBAL_RATE if is_global else MAX_LOCAL)
            if is_global and per_s > MAX_GLOBAL_PER_S:
                raise ValidationError(
                    "per",
                    f"a global rate's window is at most {MAX_GLOBAL_PER_S:g}s, got {per_s:g}s",
                )
        if key is not None and not callable(key):
            raise ValidationError("key", f"must be a function of the JobContext, got {key!r}")
        if name is not None:
            _check_name(name)
        lease_s = v.seconds("lease", lease)
        if not 0.5 <= lease_s <= 3600.0:
            raise ValidationError("lease", f"must be between 0.5s and 3600s, got {lease_s:g}s")
        set_slot = object.__setattr__
        set_slot(self, "concurrency", concurrency)
        set_slot(self, "rate", rate_n)
        set_slot(self, "per", per_s)
        set_slot(self, "key", key)
        set_slot(self, "scope", scope)
        set_slot(self, "name", name)
        set_slot(self, "lease", lease_s)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("sepp.Limit is immutable")

    @property
    def is_global(self) -> bool:
        """Whether the limit holds across processes (`scope="global"`)."""
        return self.scope == "global"

    def named(self, default: str) -> Limit:
        """This limit, with `default` as its name if it has none (a handler's job type)."""
        if self.name is not None:
            return self
        return Limit(
            concurrency=self.concurrency,
            rate=self.rate,
            per=None if self.rate is None else self.per,
            key=self.key,
            scope=self.scope,
            name=_default_name(default),
            lease=self.lease,
        )

    def key_of(self, ctx: JobContext) -> str:
        """The key `ctx` counts under ("" without a key function); the function's result as
        text. A key function that raises is the job's failure, not the limit's."""
        if self.key is None:
            return ""
        value = self.key(ctx)
        return value if type(value) is str else str(value)

    def __repr__(self) -> str:
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency={self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate={self.rate}, per={self.per:g}")
        if self.key is not None:
            parts.append(f"key={getattr(self.key, '__qualname__', self.key)!s}")
        if self.scope != "worker":
            parts.append(f"scope={self.scope!r}")
        if self.name is not None:
            parts.append(f"name={self.name!r}")
        if self.is_global and self.lease != DEFAULT_LEASE_S:
            parts.append(f"lease={self.lease:g}")
        return f"sepp.Limit({', '.join(parts)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Limit):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[object, ...]:
        return (self.concurrency, self.rate, self.per, self.key, self.scope, self.name, self.lease)


def _rate_and_per(
    rate: int | str | None, per: float | timedelta | None
) -> tuple[int | None, float]:
    if isinstance(rate, str):
        if per is not None:
            raise ValidationError("per", f"rate={rate!r} already says the window; drop per=")
        match = _RATE.match(rate)
        if match is None:
            raise ValidationError(
                "rate", f'must be an int or like "10/s", "100/m", "1000/h", got {rate!r}'
            )
        count, multiple, unit = match.groups()
        window_s = (float(multiple) if multiple else 1.0) * _UNIT_S[unit]
        if window_s <= 0:
            raise ValidationError("rate", f"the window must be positive, got {rate!r}")
        return int(count), window_s
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int)):
        raise ValidationError("rate", f'must be an int or like "10/s", got {type(rate).__name__}')
    per_s = 1.0 if per is None else v.seconds("per", per)
    if rate is None and per is not None:
        raise ValidationError("per", "per= is the window of rate=; give rate= too")
    return rate, per_s


def _check_name(name: object) -> str:
    text = v.utf8_text("name", name)
    if len(text.encode("utf-8")) > MAX_NAME_BYTES or not _NAME.match(text):
        raise ValidationError(
            "name",
            f"must be up to {MAX_NAME_BYTES} letters, digits and . _ : - (starting with a letter"
            f" or digit), got {text!r}",
        )
    return text


def _default_name(job_type: str) -> str:
    """A job type as a limit name: kept when it fits, else a readable prefix and a digest."""
    if len(job_type.encode("utf-8")) <= MAX_NAME_BYTES and _NAME.match(job_type):
        return job_type
    import hashlib

    digest = hashlib.sha256(job_type.encode("utf-8")).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9._:-]", "_", job_type)[:64].lstrip("._:-") or "type"
    return f"{readable}.{digest}"
