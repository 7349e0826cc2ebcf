"""The Worker's log lines: what happened to its reserves, each job and its shutdown, in words
(and, for finished jobs, in fields for structured logs)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .._model import settlement as outcomes
from .._model.errors import (
    AttemptMismatchError,
    JobNotFoundError,
    SeppError,
    UnauthenticatedError,
    UnknownQueuesError,
)
from .._model.settlement import HandlerError
from .._model.types import JobContext
from .._runtime.concurrency import ServiceRuntime
from .._util.log import Log
from .client_calls import WorkerClient

# A job type without a handler is logged at ERROR at most once per this many seconds.
UNKNOWN_TYPE_LOG_INTERVAL_S = 60.0
UNKNOWN_TYPES_REMEMBERED = 1000  # the types whose last log time is kept (bounds the dict)
# How long the first dead letter's log waits for the server's retention setting.
SERVER_INFO_TIMEOUT_S = 5.0
# On the record of the ERROR line of a job this worker dead-lettered: what an error reporter
# reading the log (sepp.contrib.sentry) knows it by, once its on_dead_letter hook reported it.
DEAD_LETTER_EXTRA = {"sepp_dead_lettered": True}


class WorkerReport:
    """Writes one Worker's log lines. It asks the server (`get_server_info`, if the client has
    it) once, for the first dead letter, whether dead letters are kept at all."""

    __slots__ = (
        "_cc",
        "_client",
        "_keeps_dead_letters",
        "_log",
        "_queues",
        "_server_info_lock",
        "_unknown_logged_at",
        "_worker_id",
    )

    def __init__(
        self,
        log: Log,
        worker_id: str,
        queues: list[str],
        client: WorkerClient,
        cc: ServiceRuntime,
    ) -> None:
        self._log = log
        self._worker_id = worker_id
        self._queues = queues
        self._client = client
        self._unknown_logged_at: dict[str, float] = {}
        self._keeps_dead_letters: bool | None = None  # the server's, once asked
        self._cc = cc
        self._server_info_lock = cc.lock()

    @property
    def log(self) -> Log:
        return self._log

    # -- reserving ---------------------------------------------------------------------------

    def reserve_failed(self, exc: Exception, failures: int, delay: float) -> None:
        if isinstance(exc, (UnauthenticatedError, UnknownQueuesError)):
            # Not transient: a wrong key or an undeclared queue needs a person; say so each time.
            self._log.error(
                "sepp: worker %s cannot reserve from %s: %s (failure %d; retrying in %.2fs)",
                self._worker_id,
                self._queues,
                outcomes.describe(exc),
                failures,
                delay,
            )
        elif isinstance(exc, SeppError):
            self._log.warning(
                "sepp: worker %s: reserve failed: %s (failure %d; retrying in %.2fs)",
                self._worker_id,
                outcomes.describe(exc),
                failures,
                delay,
            )
        else:
            self._log.error(
                "sepp: worker %s: reserve raised an unexpected %s (failure %d; retrying in %.2fs)",
                self._worker_id,
                outcomes.describe(exc),
                failures,
                delay,
                exc_info=exc,
            )

    def reserve_works_again(self, failures: int) -> None:
        self._log.info(
            "sepp: worker %s: reserve works again after %d failure(s)", self._worker_id, failures
        )

    # -- jobs --------------------------------------------------------------------------------

    def redelivered_while_running(self, ctx: JobContext, earlier_attempt: int) -> None:
        self._log.warning(
            "sepp: %s was redelivered while its attempt %d still runs in this worker; it"
            " starts when that run ends",
            ctx,
            earlier_attempt,
        )

    def unknown_type(self, ctx: JobContext, delay_s: float | None, handled: Iterable[str]) -> None:
        """No handler for the job's type (`handled`: the types with one): at ERROR once a
        minute per type, else at DEBUG."""
        now = self._cc.current_time()
        logged_at = self._unknown_logged_at.get(ctx.job_type)
        if logged_at is None or now - logged_at >= UNKNOWN_TYPE_LOG_INTERVAL_S:
            if len(self._unknown_logged_at) >= UNKNOWN_TYPES_REMEMBERED:
                self._unknown_logged_at.clear()
            self._unknown_logged_at[ctx.job_type] = now
            log: Callable[..., None] = self._log.error
        else:
            log = self._log.debug
        if delay_s is None:
            action = "dead-lettering it"
        elif ctx.is_final_attempt:
            action = "its final attempt: it is dead-lettered"
        else:
            action = f"returning it to the queue for {delay_s:.3g}s"
        log(
            "sepp: worker %s has no handler for job type %r (job %s, attempt %d/%d); %s;"
            " this worker handles: %s (logged once a minute per type)",
            self._worker_id,
            ctx.job_type,
            ctx.id,
            ctx.attempt,
            ctx.max_attempts,
            action,
            ", ".join(sorted(handled)) or "nothing",
        )

    def finished(
        self,
        ctx: JobContext,
        label: str | None,
        dead_lettered: bool | None,
        run_s: float | None,
        wait_s: float,
    ) -> None:
        """A settled job at INFO, with its fields for structured logs: how long its handler ran
        (`run_s`, None if it never started) and how long it waited before (`wait_s`)."""
        if label == "unknown_type" or not self._log.info_enabled():
            return  # logged by unknown_type; or nobody reads INFO
        outcome = "lease_lost" if label is None else label
        if dead_lettered:
            outcome += ", dead-lettered"
        extra = {"sepp_outcome": outcome, "sepp_duration_s": run_s, "sepp_wait_s": wait_s}
        if run_s is None:
            self._log.info(
                "sepp: %s finished: %s, did not run, waited %.3fs",
                ctx,
                outcome,
                wait_s,
                extra=extra,
            )
        else:
            self._log.info(
                "sepp: %s finished: %s, ran %.3fs, waited %.3fs",
                ctx,
                outcome,
                run_s,
                wait_s,
                extra=extra,
            )

    def settle_failed(self, verb: str, ctx: JobContext, exc: Exception) -> None:
        """The ack or nack (`verb`) of `ctx` raised `exc`."""
        if isinstance(exc, JobNotFoundError):
            self._log.warning(
                "sepp: %s of %s found no lease (%s): it expired and was swept, or an earlier"
                " try of this %s already succeeded; if the former, the job runs again",
                verb,
                ctx,
                exc,
                verb,
            )
        elif isinstance(exc, AttemptMismatchError):
            self._log.warning(
                "sepp: %s of %s was refused (%s): the lease was lost and the job redelivered"
                " as a newer attempt; this result is discarded",
                verb,
                ctx,
                exc,
            )
        elif isinstance(exc, SeppError):
            self._log.warning(
                "sepp: %s of %s failed: %s; unless it reached the server, the job is"
                " redelivered when its lease expires",
                verb,
                ctx,
                outcomes.describe(exc),
            )
        else:
            self._log.error(
                "sepp: %s of %s raised an unexpected %s; the job is redelivered when its lease"
                " expires",
                verb,
                ctx,
                outcomes.describe(exc),
                exc_info=exc,
            )

    async def nacked(
        self, ctx: JobContext, outcome: outcomes.Outcome, dead_lettered: bool | None
    ) -> None:
        """One line per nacked job: ERROR "dead-lettered" when the nack ended it, else what
        failed and when the job comes back (unknown types log by themselves)."""
        label = outcome.label
        error = outcome.error
        if dead_lettered:
            if label == "permanent":
                why = f"the handler gave up on it: {outcome.reason}"
            elif label == "given_up":
                why = f"its failure policy does not retry it: {outcome.reason}"
            elif label == "unknown_type":
                why = "no handler for its type"
            elif label == "shutdown":
                why = "its final attempt was cut short by a worker shutdown"
            else:
                why = f"{_what_failed(outcome)} on its final attempt"
            self._log.error(
                "sepp: %s dead-lettered: %s%s",
                ctx,
                why,
                await self._dead_letter_note(),
                exc_info=outcomes.logged_traceback(outcome),
                extra=DEAD_LETTER_EXTRA,
            )
            return
        if label in ("shutdown", "unknown_type"):
            return
        if dead_lettered is None:
            if error is None or isinstance(error, HandlerError):
                return  # the failed nack said it all
            when = "its nack failed (see above)"
        elif outcome.delay_s is not None:
            when = f"retrying in {outcome.delay_s:.3g}s"
        elif outcome.retry is not None and outcome.retry.delay is not None:
            when = f"retrying in {outcome.retry.delay.total_seconds():.3g}s"
        else:
            when = "retrying with the queue's retry policy"
        self._log.warning(
            "sepp: %s %s; %s",
            ctx,
            _what_failed(outcome),
            when,
            exc_info=outcomes.logged_traceback(outcome),
        )

    def hook_failed(self, name: str, ctx: JobContext, exc: Exception) -> None:
        """An on_dead_letter hook raised: logged, with its traceback; the job stays settled."""
        self._log.error(
            "sepp: the on_dead_letter hook %s raised for %s (dead-lettered): %s",
            name,
            ctx,
            outcomes.describe(exc),
            exc_info=exc,
        )

    def hooks_cancelled(self, ctx: JobContext) -> None:
        self._log.warning(
            "sepp: the on_dead_letter hooks of %s were cancelled by a forced shutdown", ctx
        )

    async def _dead_letter_note(self) -> str:
        """Says so when the server keeps no dead letters (asked once, on the first)."""
        async with self._server_info_lock:
            get_server_info = getattr(self._client, "get_server_info", None)
            if self._keeps_dead_letters is None and get_server_info is not None:
                with self._cc.move_on_after(SERVER_INFO_TIMEOUT_S):
                    try:
                        info = await get_server_info()
                        self._keeps_dead_letters = bool(info.dead_letter_retention_enabled)
                    except Exception as exc:
                        self._log.debug("sepp: get_server_info failed: %s", exc)
        if self._keeps_dead_letters is False:
            return (
                " (this server keeps no dead letters, dead_letter_retention_ms is 0: the job"
                " is gone)"
            )
        return ""

    # -- pausing -----------------------------------------------------------------------------

    def paused(self, held: int) -> None:
        self._log.info(
            "sepp: worker %s paused: reserving no more jobs; the %d it holds run and settle"
            " (their leases kept)",
            self._worker_id,
            held,
        )

    def resumed(self) -> None:
        self._log.info("sepp: worker %s resumed: reserving again", self._worker_id)

    # -- shutdown ----------------------------------------------------------------------------

    def waiting_for_jobs(self, count: int, timeout_s: float) -> None:
        self._log.info(
            "sepp: worker %s shutting down; waiting up to %.3gs for %d job(s)",
            self._worker_id,
            timeout_s,
            count,
        )

    def cancelling_jobs(self, count: int, *, told_to_stop_now: bool) -> None:
        why = "told to stop now" if told_to_stop_now else "shutdown_timeout passed"
        self._log.warning(
            "sepp: worker %s: %s; cancelling %d job(s) and returning them to the queue",
            self._worker_id,
            why,
            count,
        )


def _what_failed(outcome: outcomes.Outcome) -> str:
    if outcome.label == "timeout":
        return "timed out"
    if outcome.label == "retry":
        return f"asked for a retry: {outcome.reason}"
    if outcome.label == "retry_after":
        return f"asked for a retry later: {outcome.reason}"
    assert outcome.error is not None
    return f"failed: the handler raised {outcomes.describe(outcome.error)}"
