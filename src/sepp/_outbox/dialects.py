"""The SQL of the outbox for each database it runs on, and how a connection tells which.

sqlite3 keeps times as Unix seconds (REAL) and `scheduled_at` as ISO 8601 text; PostgreSQL as
timestamptz. Both keep one row per job, `state` 'pending' until the relay forwards it (the row
is then deleted) or 'rejected' (kept, with the server's reason in `rejection`). A relay claims
rows by writing `claimed_by` (a token of its own per claim) and `claimed_until`: other relays
skip a claimed row until the claim expires.
"""

from __future__ import annotations

import re

from .._model.errors import ValidationError

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
DIALECTS = (SQLITE, POSTGRESQL)

# The columns add() writes and the relay reads back, in this order.
JOB_COLUMNS = (
    "queue",
    "job_type",
    "payload",
    "encoding",
    "idempotency_key",
    "priority",
    "max_attempts",
    "scheduled_at",
    "custom",
)

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def table_name(value: object) -> str:
    """A table name safe to put in SQL as is: letters, digits and underscores."""
    if not isinstance(value, str) or not _TABLE_NAME.fullmatch(value):
        raise ValidationError(
            "table", f"must be letters, digits and underscores (up to 63), got {value!r}"
        )
    return value


def dialect_name(value: object) -> str:
    if value not in DIALECTS:
        raise ValidationError("dialect", f"must be one of {', '.join(DIALECTS)}, got {value!r}")
    return str(value)


def ddl(dialect: str, table: str) -> list[str]:
    """The statements that create the table and its index (each IF NOT EXISTS)."""
    dialect, table = dialect_name(dialect), table_name(table)
    if dialect == SQLITE:
        return [
            f"CREATE TABLE IF NOT EXISTS {table} (\n"
            "    id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
            "    queue TEXT NOT NULL,\n"
            "    job_type TEXT NOT NULL,\n"
            "    payload BLOB,\n"
            "    encoding TEXT,\n"
            "    idempotency_key TEXT NOT NULL,\n"
            "    priority INTEGER,\n"
            "    max_attempts INTEGER,\n"
            "    scheduled_at TEXT,\n"
            "    custom TEXT,\n"
            "    created_at REAL NOT NULL,\n"
            "    state TEXT NOT NULL DEFAULT 'pending',\n"
            "    rejection TEXT,\n"
            "    claimed_by TEXT,\n"
            "    claimed_until REAL\n"
            ")",
            f"CREATE INDEX IF NOT EXISTS {table}_state_id ON {table} (state, id)",
        ]
    return [
        f"CREATE TABLE IF NOT EXISTS {table} (\n"
        "    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n"
        "    queue TEXT NOT NULL,\n"
        "    job_type TEXT NOT NULL,\n"
        "    payload BYTEA,\n"
        "    encoding TEXT,\n"
        "    idempotency_key TEXT NOT NULL,\n"
        "    priority SMALLINT,\n"
        "    max_attempts BIGINT,\n"
        "    scheduled_at TIMESTAMPTZ,\n"
        "    custom TEXT,\n"
        "    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),\n"
        "    state TEXT NOT NULL DEFAULT 'pending',\n"
        "    rejection TEXT,\n"
        "    claimed_by TEXT,\n"
        "    claimed_until TIMESTAMPTZ\n"
        ")",
        f"CREATE INDEX IF NOT EXISTS {table}_state_id ON {table} (state, id)",
    ]


def insert_sql(dialect: str, table: str, placeholder: str) -> str:
    columns = (*JOB_COLUMNS, "created_at") if dialect == SQLITE else JOB_COLUMNS
    marks = ", ".join([placeholder] * len(columns))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


def notify_sql(placeholder: str) -> str:
    """PostgreSQL: wake the relays listening on the table's channel when the caller commits
    (notifications are delivered at commit, and one per channel per transaction)."""
    return f"SELECT pg_notify({placeholder}, '')"


def dialect_of_module(module: str) -> str | None:
    """The dialect of a DB-API driver, from the module its connection class lives in."""
    root = module.split(".")[0]
    if root in ("sqlite3", "_sqlite3"):  # PyPy's sqlite3 classes live in `_sqlite3`
        return SQLITE
    if root == "psycopg":
        return POSTGRESQL
    return None


def dialect_of_url(url: str) -> tuple[str, str]:
    """`sqlite:///path` -> (sqlite, path); `postgresql://...` -> (postgresql, the URL)."""
    if not isinstance(url, str):
        raise ValidationError("database", f"must be a URL string, got {type(url).__name__}")
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if not path:
            raise ValidationError("database", "sqlite:///PATH needs a path")
        return SQLITE, path  # sqlite:///app.db is relative, sqlite:////srv/app.db absolute
    if url.startswith(("postgresql://", "postgres://")):
        return POSTGRESQL, url
    raise ValidationError(
        "database", f"must be sqlite:///PATH or postgresql://..., got {url.split(':')[0]}:..."
    )
