"""The options of `sepp.Worker`, checked once (ValidationError) into one frozen value."""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from .._limits.waiting import DEFAULT_PATIENCE_S, default_room
from .._model import validate as v
from .._model.backoff import Backoff
from .._model.errors import ValidationError
from .._runtime.wall_clock import utc_now
from .._util.log import Log, LoggerLike
from .dead_letter_hooks import checked_hook
from .failure_policy import checked_exception_types
from .middleware import Middleware, checked_middleware
from .monitor import WorkerMonitor
from .router import (
    BackoffSetting,
    Lifespan,
    LifespanCall,
    Router,
    RouteSettings,
    checked_backoff,
    lifespan_call,
    optional_timeout,
)

UnknownTypes = Backoff | Literal["dead_letter"]

DEFAULT_BACKOFF = Backoff()
# Job types without a handler come back much later than failures: a newer worker that knows
# the type may take minutes to roll out, and each return still costs the job an attempt.
DEFAULT_UNKNOWN_TYPE_BACKOFF = Backoff(60.0, max=3600.0, jitter=0.1)


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    queues: tuple[str, ...]
    lease_s: float
    wait_s: float
    max_in_flight: int
    max_jobs: int | None
    shutdown_timeout_s: float
    reserve_backoff_s: float  # the first reserve retry's delay
    auto_extend: bool
    worker_id: str
    log: Log
    now_utc: Callable[[], datetime]
    # The worker's middleware, timeout, backoff (always one), failure policy and hook.
    own: RouteSettings
    unknown_types: UnknownTypes
    monitor: WorkerMonitor | None
    loop_block_warning_s: float | None  # warn when a handler's step holds the loop this long
    handlers: Router | None
    lifespan: LifespanCall | None  # the Worker's, or its handlers' Router's, called as f(worker)
    limit_waiting: int  # how many held jobs may wait for limits at once (the waiting room)
    limit_patience_s: float  # how long one waits before it is deferred (inf: for ever)

    @classmethod
    def parse(
        cls,
        queues: Sequence[str] | str,
        *,
        lease_duration: float | timedelta,
        max_in_flight: int,
        auto_extend: bool,
        wait_timeout: float | timedelta,
        max_jobs: int | None,
        worker_id: str | None,
        shutdown_timeout: float | timedelta,
        reserve_error_backoff: float | timedelta,
        logger: LoggerLike | None,
        handlers: Router | None,
        lifespan: Lifespan | None,
        middleware: Iterable[Middleware],
        timeout: float | timedelta | None,
        backoff: BackoffSetting,
        retry_on: object,
        give_up_on: object,
        unknown_types: UnknownTypes,
        on_dead_letter: object,
        monitor: WorkerMonitor | None,
        loop_block_warning: float | timedelta | None,
        wall_clock: Callable[[], datetime] | None,
        limit_waiting: int | None = None,
        limit_patience: float | timedelta | None = DEFAULT_PATIENCE_S,
    ) -> WorkerSettings:
        """Check every option, in the order the Worker's signature names them."""
        names = [queues] if isinstance(queues, str) else list(queues)
        if not names:
            raise ValidationError("queues", "must name at least one queue")
        for index, name in enumerate(names):
            v.queue_name(f"queues[{index}]", name)
        lease_s = v.seconds("lease_duration", lease_duration)
        wait_s = v.seconds("wait_timeout", wait_timeout)
        max_in_flight = v.whole_number("max_in_flight", max_in_flight, low=1, high=v.UINT32_MAX)
        if max_jobs is not None:
            max_jobs = v.whole_number("max_jobs", max_jobs, low=1, high=v.UINT32_MAX)
        shutdown_timeout_s = v.seconds("shutdown_timeout", shutdown_timeout, allow_zero=True)
        reserve_backoff_s = v.seconds("reserve_error_backoff", reserve_error_backoff)
        if not isinstance(auto_extend, bool):
            raise ValidationError("auto_extend", "must be a bool")
        worker_id = (
            _default_worker_id() if worker_id is None else v.utf8_text("worker_id", worker_id)
        )
        log = Log(logger if logger is not None else logging.getLogger("sepp.worker"))

        own_backoff = checked_backoff("backoff", backoff)
        if own_backoff is None:
            raise ValidationError("backoff", "must be a sepp.Backoff or sepp.Retry.DEFAULT")
        own = RouteSettings(
            checked_middleware("middleware", middleware),
            optional_timeout(timeout),
            own_backoff,
            checked_exception_types("retry_on", retry_on),
            checked_exception_types("give_up_on", give_up_on),
            checked_hook("on_dead_letter", on_dead_letter),
        )
        if unknown_types != "dead_letter" and not isinstance(unknown_types, Backoff):
            raise ValidationError(
                "unknown_types", f'must be a sepp.Backoff or "dead_letter", got {unknown_types!r}'
            )
        if monitor is not None and not isinstance(monitor, WorkerMonitor):
            raise ValidationError(
                "monitor", f"must be a sepp.WorkerMonitor, got {type(monitor).__name__}"
            )
        loop_block_warning_s = (
            None
            if loop_block_warning is None
            else v.seconds("loop_block_warning", loop_block_warning)
        )
        if handlers is not None:
            if not isinstance(handlers, Router):
                raise ValidationError(
                    "handlers", f"must be a sepp.Router, got {type(handlers).__name__}"
                )
            if handlers.lifespan is not None:
                if lifespan is not None:
                    raise ValidationError(
                        "lifespan", "given twice: to the Worker and to its handlers' Router"
                    )
                lifespan = handlers.lifespan
        if limit_waiting is None:
            limit_waiting = default_room(max_in_flight)
        else:
            limit_waiting = v.whole_number(
                "limit_waiting", limit_waiting, low=1, high=max_in_flight
            )
        limit_patience_s = (
            math.inf
            if limit_patience is None
            else v.seconds("limit_patience", limit_patience, allow_zero=True)
        )
        return cls(
            queues=tuple(names),
            lease_s=lease_s,
            wait_s=wait_s,
            max_in_flight=max_in_flight,
            max_jobs=max_jobs,
            shutdown_timeout_s=shutdown_timeout_s,
            reserve_backoff_s=reserve_backoff_s,
            auto_extend=auto_extend,
            worker_id=worker_id,
            log=log,
            now_utc=wall_clock or utc_now,
            own=own,
            unknown_types=unknown_types,
            monitor=monitor,
            loop_block_warning_s=loop_block_warning_s,
            handlers=handlers,
            lifespan=None if lifespan is None else lifespan_call(lifespan),
            limit_waiting=limit_waiting,
            limit_patience_s=limit_patience_s,
        )


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
