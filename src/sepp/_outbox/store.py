"""The relay's database work, blocking (the async relay runs each call in a thread): claim a
batch of rows, settle it (delete, mark rejected, release), count the backlog, wait for new
rows. One `Store` per relay, used by one thread at a time.

Claims: a relay writes a fresh token into `claimed_by` and an expiry into `claimed_until` for
the oldest pending rows nobody holds, in one short transaction (sqlite3: `BEGIN IMMEDIATE`,
the database's write lock; PostgreSQL: `FOR UPDATE SKIP LOCKED`, so relays claiming at once
take different rows without waiting for each other). No transaction stays open while a batch
is on the network; a relay that dies holding a claim delays its rows until the claim expires,
and the next relay's resend is deduplicated by the rows' idempotency keys.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import dialects
from .rows import OutboxRow

_COLUMNS = ", ".join(("id", *dialects.JOB_COLUMNS))


@dataclass(frozen=True, slots=True)
class Backlog:
    """What the table holds: rows waiting, the oldest one's age (seconds; 0 when none), and
    rows rejected."""

    waiting: int
    oldest_age_s: float
    rejected: int


@dataclass(frozen=True, slots=True)
class Claim:
    token: str
    rows: list[OutboxRow]


class Store:
    """The SQL shared by both dialects; the subclasses open connections and claim."""

    dialect = ""
    placeholder = ""
    listens = False  # whether wait() blocks until rows arrive (else the relay polls)

    def __init__(self, table: str) -> None:
        self.table = dialects.table_name(table)

    # -- per dialect ------------------------------------------------------------------------

    def claim(self, limit: int, claim_s: float) -> Claim:
        raise NotImplementedError

    def backlog(self) -> Backlog:
        raise NotImplementedError

    def connection(self) -> Any:
        raise NotImplementedError

    def _begin(self, connection: Any) -> None:
        raise NotImplementedError

    def wait(self, timeout_s: float) -> None:
        """Block until rows may have arrived, or `timeout_s` passed (listening stores)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------

    def settle(
        self,
        token: str,
        done: Sequence[int],
        rejected: Sequence[tuple[int, str]],
        released: Sequence[int],
    ) -> None:
        """In one transaction: delete `done` (the server has them), mark `rejected` with their
        reasons, and give `released` back (this relay's claim only)."""
        p, t = self.placeholder, self.table
        connection = self.connection()
        self._begin(connection)
        try:
            cursor = connection.cursor()
            for start in range(0, len(done), 500):
                ids = done[start : start + 500]
                cursor.execute(f"DELETE FROM {t} WHERE id IN ({', '.join([p] * len(ids))})", ids)
            for row_id, reason in rejected:
                cursor.execute(
                    f"UPDATE {t} SET state = 'rejected', rejection = {p}, claimed_by = NULL,"
                    f" claimed_until = NULL WHERE id = {p}",
                    (reason, row_id),
                )
            for start in range(0, len(released), 500):
                ids = released[start : start + 500]
                cursor.execute(
                    f"UPDATE {t} SET claimed_by = NULL, claimed_until = NULL WHERE claimed_by"
                    f" = {p} AND id IN ({', '.join([p] * len(ids))})",
                    (token, *ids),
                )
            cursor.close()
            connection.commit()
        except BaseException:
            connection.rollback()
            raise

    def requeue_rejected(self) -> int:
        """Make every rejected row pending again (after fixing what the server refused)."""
        connection = self.connection()
        self._begin(connection)
        try:
            cursor = connection.cursor()
            cursor.execute(
                f"UPDATE {self.table} SET state = 'pending', rejection = NULL"
                " WHERE state = 'rejected'"
            )
            count = int(cursor.rowcount)
            cursor.close()
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        return count


class SqliteStore(Store):
    dialect = dialects.SQLITE
    placeholder = "?"

    def __init__(self, path: str, table: str, *, busy_timeout_s: float = 30.0) -> None:
        super().__init__(table)
        self.path = path
        self._busy_timeout_s = busy_timeout_s
        self._conn: Any = None

    def connection(self) -> Any:
        if self._conn is None:
            import sqlite3

            # isolation_level=None: transactions are the ones begun here; the relay's calls
            # run in whichever thread is free, one at a time.
            self._conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
        return self._conn

    def _begin(self, connection: Any) -> None:
        connection.execute("BEGIN IMMEDIATE")  # the write lock now, not at the first write

    def claim(self, limit: int, claim_s: float) -> Claim:
        token = str(uuid.uuid4())
        t = self.table
        connection = self.connection()
        self._begin(connection)
        try:
            now = time.time()
            connection.execute(
                f"UPDATE {t} SET claimed_by = ?, claimed_until = ? WHERE id IN (SELECT id FROM"
                f" {t} WHERE state = 'pending' AND (claimed_until IS NULL OR claimed_until < ?)"
                " ORDER BY id LIMIT ?)",
                (token, now + claim_s, now, limit),
            )
            rows = connection.execute(
                f"SELECT {_COLUMNS} FROM {t} WHERE claimed_by = ? ORDER BY id", (token,)
            ).fetchall()
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        return Claim(token, [OutboxRow(row[0], tuple(row[1:])) for row in rows])

    def backlog(self) -> Backlog:
        row = (
            self.connection()
            .execute(
                "SELECT COUNT(*) FILTER (WHERE state = 'pending'),"
                " MIN(created_at) FILTER (WHERE state = 'pending'),"
                f" COUNT(*) FILTER (WHERE state = 'rejected') FROM {self.table}"
            )
            .fetchone()
        )
        oldest = max(0.0, time.time() - row[1]) if row[1] is not None else 0.0
        return Backlog(int(row[0]), oldest, int(row[2]))

    def wait(self, timeout_s: float) -> None:
        time.sleep(timeout_s)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresStore(Store):
    dialect = dialects.POSTGRESQL
    placeholder = "%s"
    listens = True

    def __init__(self, url: str, table: str, channel: str) -> None:
        super().__init__(table)
        self.url = url
        self.channel = channel
        self._conn: Any = None
        self._listener: Any = None

    def _psycopg(self) -> Any:
        try:
            import psycopg
        except ImportError:
            from .._model.errors import SeppError

            raise SeppError(
                "the outbox on PostgreSQL needs psycopg 3: pip install 'sepp-trio[postgres]'"
            ) from None
        return psycopg

    def connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = self._psycopg().connect(self.url)
        return self._conn

    def _begin(self, connection: Any) -> None:
        pass  # psycopg begins a transaction with the first statement

    def claim(self, limit: int, claim_s: float) -> Claim:
        token = str(uuid.uuid4())
        t = self.table
        connection = self.connection()
        try:
            rows = connection.execute(
                f"UPDATE {t} SET claimed_by = %s, claimed_until = now() + make_interval(secs =>"
                f" %s) WHERE id IN (SELECT id FROM {t} WHERE state = 'pending' AND"
                " (claimed_until IS NULL OR claimed_until < now()) ORDER BY id LIMIT %s"
                f" FOR UPDATE SKIP LOCKED) RETURNING {_COLUMNS}",
                (token, claim_s, limit),
            ).fetchall()
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        rows.sort(key=lambda row: row[0])  # RETURNING keeps no order
        return Claim(token, [OutboxRow(row[0], tuple(row[1:])) for row in rows])

    def backlog(self) -> Backlog:
        connection = self.connection()
        try:
            row = connection.execute(
                "SELECT COUNT(*) FILTER (WHERE state = 'pending'),"
                " EXTRACT(EPOCH FROM clock_timestamp() - MIN(created_at)"
                " FILTER (WHERE state = 'pending')),"
                f" COUNT(*) FILTER (WHERE state = 'rejected') FROM {self.table}"
            ).fetchone()
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        oldest = max(0.0, float(row[1])) if row[1] is not None else 0.0
        return Backlog(int(row[0]), oldest, int(row[2]))

    def wait(self, timeout_s: float) -> None:
        if self._listener is None or self._listener.closed:
            self._listener = self._psycopg().connect(self.url, autocommit=True)
            self._listener.execute(f'LISTEN "{self.channel}"')
        for _ in self._listener.notifies(timeout=timeout_s, stop_after=1):
            pass
        # Notifications that came together are one wake-up: the claim takes what is there.

    def close(self) -> None:
        for connection in (self._conn, self._listener):
            if connection is not None:
                connection.close()
        self._conn = self._listener = None


def open_store(database: str | Callable[[], Any], table: str, channel: str) -> Store:
    """A store for a database URL (`sqlite:///path`, `postgresql://...`)."""
    if callable(database):
        raise TypeError("open_store takes a URL")
    dialect, where = dialects.dialect_of_url(database)
    if dialect == dialects.SQLITE:
        return SqliteStore(where, table)
    return PostgresStore(where, table, channel)
