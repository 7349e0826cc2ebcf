"""`Outbox`: a job written into the application's database, in the application's transaction."""

from __future__ import annotations

import dataclasses
import inspect
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from .._client import operations as ops
from .._client.chunking import SERVER_MAX_MESSAGE_BYTES, estimated_bytes
from .._client.limits import ServerLimits
from .._model.errors import JobRejectedError, ValidationError
from .._model.types import EnqueueRequest, Payload, ServerInfo
from .._model.validate import CustomValue
from . import dialects
from .rows import row_values

DEFAULT_TABLE = "sepp_outbox"


class Outbox:
    """Jobs kept in your own database until a relay (`sepp.OutboxRelay`, or
    `sepp-trio outbox relay`) has handed them to the server.

    `add()` writes a job into the table `table` in the transaction of the connection you give
    it, so the job exists if and only if your transaction commits. Connections: sqlite3,
    psycopg (3) ones or their cursors, and Django's `django.db.connection`.

    `limits`: a `ServerInfo` (from `client.get_server_info()`) to check jobs against the
    server's advertised limits as well, as `enqueue` does when connected; without it `add()`
    checks everything that needs no server.
    """

    __slots__ = ("_limits", "_table")

    def __init__(self, table: str = DEFAULT_TABLE, *, limits: ServerInfo | None = None) -> None:
        self._table = dialects.table_name(table)
        if limits is not None and not isinstance(limits, ServerInfo):
            raise ValidationError(
                "limits", f"must be a sepp.ServerInfo, got {type(limits).__name__}"
            )
        self._limits = limits

    @property
    def table(self) -> str:
        """The table's name."""
        return self._table

    def __repr__(self) -> str:
        return f"<sepp.Outbox {self._table}>"

    @property
    def channel(self) -> str:
        """The PostgreSQL notification channel add() notifies and relays listen on."""
        return self._table

    def add(
        self,
        connection: Any,
        queue: str | EnqueueRequest,
        job_type: str | None = None,
        *,
        payload: Payload | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, CustomValue] | None = None,
        scheduled_at: datetime | None = None,
    ) -> str:
        """Write one job (an EnqueueRequest, or its fields, as `enqueue` takes them) into the
        outbox in `connection`'s current transaction; never commits. The job is checked as
        `enqueue` checks it before anything is written. Returns its idempotency key: the one
        given, else a new random one, which makes the relay's retries safe."""
        request = ops.enqueue_request(
            queue,
            job_type,
            payload=payload,
            idempotency_key=idempotency_key,
            priority=priority,
            max_attempts=max_attempts,
            custom=custom,
            scheduled_at=scheduled_at,
            trace_context=None,
        )
        request = self._checked(request)
        dialect, placeholder, execute = _writer(connection)
        execute(
            dialects.insert_sql(dialect, self._table, placeholder),
            (
                (*row_values(request, dialect), time.time())
                if dialect == dialects.SQLITE
                else row_values(request, dialect)
            ),
        )
        if dialect == dialects.POSTGRESQL:
            execute(dialects.notify_sql(placeholder), (self.channel,))
        assert request.idempotency_key is not None
        return request.idempotency_key

    def _checked(self, request: EnqueueRequest) -> EnqueueRequest:
        if request.trace_context is not None:
            raise ValidationError("trace_context", "is not kept in the outbox")
        if request.idempotency_key is None:
            request = dataclasses.replace(request, idempotency_key=str(uuid.uuid4()))
        if self._limits is not None:
            # Taken as fetched now: the server's clock is assumed to be ours.
            rejection = ServerLimits(self._limits, self._limits.server_time).check(request)
            if rejection is not None:
                raise JobRejectedError(rejection)
        size = estimated_bytes(request)
        if size > SERVER_MAX_MESSAGE_BYTES:
            raise ValidationError(
                "payload",
                f"the job encodes to about {size} bytes, over the server's"
                f" {SERVER_MAX_MESSAGE_BYTES}-byte message cap: it could never be sent",
            )
        return request

    def ddl(self, dialect: str) -> str:
        """The SQL that creates the table, for `dialect` "sqlite" or "postgresql": for a
        migration of your own (Django's RunSQL, Alembic's op.execute)."""
        return ";\n".join(dialects.ddl(dialect, self._table)) + ";\n"

    def create_table(self, connection: Any) -> None:
        """Create the table and its index if they do not exist, in `connection`'s current
        transaction (commit it: PostgreSQL's DDL is transactional)."""
        dialect, _, execute = _writer(connection)
        for statement in dialects.ddl(dialect, self._table):
            execute(statement, ())


Execute = Callable[[str, tuple[object, ...]], None]


def _writer(connection: Any) -> tuple[str, str, Execute]:
    """The dialect of `connection`, its placeholder, and a function that executes one
    statement in its current transaction."""
    vendor = getattr(connection, "vendor", None)
    if isinstance(vendor, str) and callable(getattr(connection, "cursor", None)):
        # Django's connection (a DatabaseWrapper): "%s" on every backend, and the cursor of
        # the current transaction (transaction.atomic()).
        dialect = {"sqlite": dialects.SQLITE, "postgresql": dialects.POSTGRESQL}.get(vendor)
        if dialect is None:
            raise ValidationError(
                "connection", f"Django's {vendor!r} backend is not supported (sqlite, postgresql)"
            )

        def django_execute(sql: str, params: tuple[object, ...]) -> None:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)

        return dialect, "%s", django_execute
    dialect = dialects.dialect_of_module(type(connection).__module__)
    if dialect is None:
        raise ValidationError(
            "connection",
            "must be a DB-API connection or cursor of sqlite3 or psycopg (3), or"
            f" Django's django.db.connection; got {type(connection).__module__}."
            f"{type(connection).__qualname__}",
        )
    placeholder = "?" if dialect == dialects.SQLITE else "%s"
    if callable(getattr(connection, "cursor", None)):

        def connection_execute(sql: str, params: tuple[object, ...]) -> None:
            cursor = connection.cursor()
            try:
                _blocking(cursor.execute(sql, params), connection)
            finally:
                _closed(cursor.close())

        return dialect, placeholder, connection_execute

    def cursor_execute(sql: str, params: tuple[object, ...]) -> None:
        _blocking(connection.execute(sql, params), connection)

    return dialect, placeholder, cursor_execute


def _blocking(result: object, connection: Any) -> None:
    """Refuse what an asyncio driver's execute returns (psycopg's AsyncConnection): a coroutine
    that nothing would await, so the row would never be written. Raised on the first statement,
    before anything was written."""
    if inspect.isawaitable(result):
        _closed(result)
        raise ValidationError(
            "connection",
            f"{type(connection).__module__}.{type(connection).__qualname__} is an asyncio"
            " connection, whose execute() returns a coroutine: the outbox writes with a blocking"
            " connection, in its current transaction (the async one's job would never be"
            " written)",
        )


def _closed(result: object) -> None:
    if inspect.iscoroutine(result):
        result.close()
