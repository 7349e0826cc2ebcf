"""What the relay does, without any I/O: the jobs of a claimed batch, what becomes of each row
once the server has answered (or failed to), how long to wait before the next try, and the
counters the log and the metrics show. The drivers (`relay`) do claim -> send -> settle."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._model.backoff import backoff_delay, shortening_draw
from .._model.errors import MessageTooLargeError, SeppError
from .._model.rejection_reasons import QueueFull, describe_job_rejection
from .._model.rejections import JobRejection
from .._model.types import EnqueueAck, EnqueueRequest
from .rows import OutboxRow, request_of

# Waits after failures: 0.5 s, 1 s, 2 s ... up to 30 s, less up to a quarter by jitter (relays
# that failed together do not all come back together).
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass(slots=True)
class Settlement:
    """What to do with a batch's rows: delete `done`, mark `rejected` (id, reason), release
    `released` for a later try."""

    done: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    released: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Counters:
    """What one relay did since it started."""

    relayed: int = 0  # rows the server accepted (new jobs)
    deduplicated: int = 0  # rows the server already had (a resend after a crash or a lost answer)
    rejected: int = 0  # rows moved to the rejected state
    send_failures: int = 0  # batches the server did not answer (unreachable, overloaded, ...)
    db_failures: int = 0  # database calls that failed


class RelayPolicy:
    """One relay's decisions. Feed it each batch's outcome; ask it how long to wait."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.counters = Counters()
        self.failures_in_a_row = 0
        self._next_limit = batch_size

    def claim_limit(self) -> int:
        """How many rows to claim next (1 while isolating a job too large for the server)."""
        return self._next_limit

    def jobs(
        self, rows: list[OutboxRow]
    ) -> tuple[list[OutboxRow], list[EnqueueRequest], Settlement]:
        """The rows that can be sent with their jobs, and the settlement so far: a row that
        no longer reads as a job (changed by hand) is rejected with the reason."""
        sendable: list[OutboxRow] = []
        requests: list[EnqueueRequest] = []
        settlement = Settlement()
        for row in rows:
            try:
                requests.append(request_of(row.values))
            except (SeppError, ValueError, TypeError) as exc:
                settlement.rejected.append((row.id, f"unreadable row: {exc}"))
                self.counters.rejected += 1
                continue
            sendable.append(row)
        return sendable, requests, settlement

    def answered(
        self,
        rows: list[OutboxRow],
        results: list[EnqueueAck | JobRejection],
        settlement: Settlement,
    ) -> Settlement:
        """The server answered each row: accepted or deduplicated rows go, rejected ones are
        kept as rejected, a full queue's are tried again later (back-pressure, not a verdict)."""
        self._next_limit = self.batch_size
        full = False
        for row, result in zip(rows, results, strict=True):
            if isinstance(result, EnqueueAck):
                settlement.done.append(row.id)
                if result.deduplicated:
                    self.counters.deduplicated += 1
                else:
                    self.counters.relayed += 1
            elif isinstance(result, QueueFull):
                settlement.released.append(row.id)
                full = True
            else:
                reason = f"{type(result).__name__}: {describe_job_rejection(result)}"
                settlement.rejected.append((row.id, reason))
                self.counters.rejected += 1
        if full:
            self.failures_in_a_row += 1
        else:
            self.failures_in_a_row = 0
        return settlement

    def send_failed(
        self, rows: list[OutboxRow], error: SeppError, settlement: Settlement
    ) -> Settlement:
        """No answer for the batch: its rows are released to be sent again (their keys make
        that safe), except a lone job too large for any request, which is rejected."""
        self.counters.send_failures += 1
        if isinstance(error, MessageTooLargeError):
            if len(rows) == 1:
                settlement.rejected.append((rows[0].id, f"{type(error).__name__}: {error}"))
                self.counters.rejected += 1
                self._next_limit = self.batch_size
                return settlement
            self._next_limit = 1  # find the one that is too large, one row at a time
            settlement.released.extend(row.id for row in rows)
            return settlement
        self.failures_in_a_row += 1
        settlement.released.extend(row.id for row in rows)
        return settlement

    def db_failed(self) -> None:
        self.counters.db_failures += 1
        self.failures_in_a_row += 1

    def backoff_s(self) -> float:
        """How long to wait before the next try: 0 unless the last tries failed."""
        if not self.failures_in_a_row:
            return 0.0
        return backoff_delay(
            self.failures_in_a_row,
            initial=BACKOFF_INITIAL_S,
            multiplier=2.0,
            cap=BACKOFF_MAX_S,
            jitter=0.25,
            draw=shortening_draw(),
        )
