"""sepp.Outbox without a server: add() checks a job as enqueue() does before writing it, writes
it in the caller's transaction and nothing more, and the row reads back as the same job; the
relay's policy settles each answer."""

from __future__ import annotations

import math
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sepp
from sepp._model.rejection_reasons import JobTypeNotAllowed, QueueFull
from sepp._outbox import dialects
from sepp._outbox.policy import RelayPolicy
from sepp._outbox.rows import OutboxRow, request_of, row_values
from sepp._outbox.store import SqliteStore


@pytest.fixture
def db(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / "app.db")
    sepp.Outbox().create_table(conn)
    conn.commit()
    return conn


def count(conn: sqlite3.Connection, table: str = "sepp_outbox") -> int:
    return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


BAD_JOBS: list[tuple[dict[str, object], str]] = [
    ({"queue": "", "job_type": "t"}, "queue"),
    ({"queue": " q", "job_type": "t"}, "queue"),
    ({"queue": "q", "job_type": ""}, "job_type"),
    ({"queue": "q", "job_type": None}, "job_type"),
    ({"queue": "q", "job_type": "t", "priority": 10}, "priority"),
    ({"queue": "q", "job_type": "t", "priority": True}, "priority"),
    ({"queue": "q", "job_type": "t", "max_attempts": 0}, "max_attempts"),
    ({"queue": "q", "job_type": "t", "custom": {"k": object()}}, "custom['k']"),
    ({"queue": "q", "job_type": "t", "custom": {"k": 2**64}}, "custom['k']"),
    ({"queue": "q", "job_type": "t", "scheduled_at": datetime(2030, 1, 1)}, "scheduled_at"),
    ({"queue": "q", "job_type": "t", "idempotency_key": ""}, "idempotency_key"),
    ({"queue": "q", "job_type": "t", "payload": b"raw"}, "payload"),
]


@pytest.mark.parametrize(("job", "field"), BAD_JOBS)
def test_add_refuses_what_enqueue_refuses_before_writing(
    db: sqlite3.Connection, job: dict[str, object], field: str
) -> None:
    args = dict(job)
    queue, job_type = args.pop("queue"), args.pop("job_type")
    with pytest.raises(sepp.ValidationError) as caught:
        sepp.Outbox().add(db, queue, job_type, **args)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert count(db) == 0


def test_add_writes_in_the_callers_transaction_and_never_commits(db: sqlite3.Connection) -> None:
    outbox = sepp.Outbox()
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    db.execute("INSERT INTO orders (id) VALUES (1)")
    outbox.add(db, "emails", "send")
    assert db.in_transaction
    db.rollback()
    assert count(db) == 0
    key = outbox.add(db, "emails", "send")
    db.commit()
    assert count(db) == 1
    other = sqlite3.connect(db.execute("PRAGMA database_list").fetchone()[2])
    assert other.execute("SELECT idempotency_key FROM sepp_outbox").fetchone()[0] == key


def test_a_key_is_made_unless_given(db: sqlite3.Connection) -> None:
    outbox = sepp.Outbox()
    made = {outbox.add(db, "q", "t") for _ in range(50)}
    assert len(made) == 50
    assert all(len(key) == 36 for key in made)  # uuid4 text
    assert outbox.add(db, "q", "t", idempotency_key="order-7") == "order-7"


def test_add_takes_a_cursor_and_an_enqueue_request(db: sqlite3.Connection) -> None:
    outbox = sepp.Outbox()
    request = sepp.EnqueueRequest("q", "t", idempotency_key="k1", priority=3)
    assert outbox.add(db.cursor(), request) == "k1"
    with pytest.raises(TypeError):
        outbox.add(db, request, "t")  # type: ignore[call-overload]
    with pytest.raises(sepp.ValidationError) as caught:
        traced = sepp.TraceContext("00-" + "1" * 32 + "-" + "2" * 16 + "-01")
        outbox.add(db, sepp.EnqueueRequest("q", "t", trace_context=traced))
    assert caught.value.field == "trace_context"
    assert count(db) == 1


def test_add_refuses_a_connection_it_does_not_know(db: sqlite3.Connection) -> None:
    with pytest.raises(sepp.ValidationError) as caught:
        sepp.Outbox().add(object(), "q", "t")
    assert caught.value.field == "connection"


def test_add_checks_the_servers_limits_when_given(db: sqlite3.Connection) -> None:
    info = sepp.ServerInfo(
        server_version="x",
        supported_protocol_versions=("v1",),
        server_time=datetime.now(timezone.utc),
        restricts_encodings=False,
        allowed_encodings=(),
        max_payload_bytes=8,
        max_custom_entries=0,
        max_custom_total_bytes=0,
        max_custom_key_bytes=0,
        max_queue_name_bytes=0,
        max_job_type_bytes=0,
        max_idempotency_key_bytes=0,
        max_schedule_horizon=timedelta(days=30),
        max_enqueue_batch=0,
        max_reserve_batch=0,
        max_reserve_queues=0,
        max_wait_timeout=timedelta(seconds=30),
        max_lease_duration=timedelta(seconds=30),
        strict_queues=False,
        dead_letter_retention_enabled=False,
    )
    with pytest.raises(sepp.JobRejectedError) as caught:
        sepp.Outbox(limits=info).add(db, "q", "t", payload=sepp.Payload.bytes(b"123456789"))
    assert isinstance(caught.value.rejection, sepp.PayloadTooLarge)
    assert count(db) == 0


def test_table_names_are_checked() -> None:
    assert sepp.Outbox("jobs_out").table == "jobs_out"
    for bad in ("", "a b", "x;drop", "1abc", "a" * 64):
        with pytest.raises(sepp.ValidationError):
            sepp.Outbox(bad)


def test_create_table_twice_and_the_ddl(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    outbox = sepp.Outbox("my_outbox")
    outbox.create_table(conn)
    outbox.create_table(conn)
    conn.executescript(outbox.ddl("sqlite"))  # the documented DDL runs as it is
    assert count(conn, "my_outbox") == 0
    assert "BIGINT GENERATED ALWAYS AS IDENTITY" in outbox.ddl("postgresql")
    with pytest.raises(sepp.ValidationError):
        outbox.ddl("mysql")


def test_database_urls() -> None:
    assert dialects.dialect_of_url("sqlite:///app.db") == ("sqlite", "app.db")
    assert dialects.dialect_of_url("sqlite:////srv/app.db") == ("sqlite", "/srv/app.db")
    assert dialects.dialect_of_url("postgresql://u@h/db") == ("postgresql", "postgresql://u@h/db")
    for bad in ("mysql://x", "sqlite://", "sqlite:///", "app.db"):
        with pytest.raises(sepp.ValidationError):
            dialects.dialect_of_url(bad)


custom_values = st.one_of(
    st.text(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),
    st.booleans(),
)


@given(
    custom=st.dictionaries(st.text(min_size=1), custom_values, max_size=5),
    data=st.one_of(st.none(), st.binary(min_size=1)),
    priority=st.one_of(st.none(), st.integers(0, 9)),
    scheduled=st.one_of(st.none(), st.integers(-(10**9), 10**9)),
)
def test_a_row_reads_back_as_the_same_job(
    custom: dict[str, object], data: bytes | None, priority: int | None, scheduled: int | None
) -> None:
    request = sepp.EnqueueRequest(
        "q",
        "t",
        payload=sepp.Payload.bytes(data, "x/y") if data is not None else None,
        idempotency_key="k",
        priority=priority,
        max_attempts=7,
        custom=custom,  # type: ignore[arg-type]
        scheduled_at=(
            datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=scheduled)
            if scheduled is not None
            else None
        ),
    )
    for dialect in dialects.DIALECTS:
        back = request_of(row_values(request, dialect))
        assert back.payload == request.payload
        assert back.scheduled_at == request.scheduled_at
        assert (back.queue, back.job_type, back.priority, back.max_attempts) == (
            "q",
            "t",
            priority,
            7,
        )
        assert back.idempotency_key == "k"
        assert set(back.custom) == set(custom)
        for key, value in custom.items():
            got = back.custom[key]
            assert type(got) is type(value)
            assert got == value or (isinstance(value, float) and math.isnan(value))


def rows(n: int) -> list[OutboxRow]:
    return [
        OutboxRow(i, row_values(sepp.EnqueueRequest("q", "t", idempotency_key=f"k{i}"), "sqlite"))
        for i in range(n)
    ]


def test_the_policy_settles_each_answer() -> None:
    policy = RelayPolicy(10)
    batch = rows(4)
    sendable, requests, settlement = policy.jobs(batch)
    assert len(requests) == 4
    results: list[sepp.EnqueueAck | sepp.JobRejection] = [
        sepp.EnqueueAck("a"),
        sepp.EnqueueAck("b", deduplicated=True),
        JobTypeNotAllowed("t", ("u",)),
        QueueFull("q", 5),
    ]
    out = policy.answered(sendable, results, settlement)
    assert out.done == [0, 1]
    assert [row_id for row_id, _ in out.rejected] == [2]
    assert "JobTypeNotAllowed" in out.rejected[0][1]
    assert out.released == [3]  # a full queue is back-pressure, tried again
    assert (policy.counters.relayed, policy.counters.deduplicated, policy.counters.rejected) == (
        1,
        1,
        1,
    )
    assert policy.backoff_s() > 0


def test_the_policy_backs_off_while_the_server_fails_and_resets() -> None:
    policy = RelayPolicy(10)
    delays = []
    for _ in range(12):
        sendable, _, settlement = policy.jobs(rows(2))
        out = policy.send_failed(sendable, sepp.ConnectError("127.0.0.1:1", "down"), settlement)
        assert out.released == [0, 1] and not out.done and not out.rejected
        delays.append(policy.backoff_s())
    assert delays[0] > 0
    assert delays[-1] > delays[0]
    assert max(delays) <= 30.0
    sendable, _, settlement = policy.jobs(rows(1))
    policy.answered(sendable, [sepp.EnqueueAck("x")], settlement)
    assert policy.backoff_s() == 0


def test_a_job_too_large_for_any_request_is_isolated_then_rejected() -> None:
    policy = RelayPolicy(10)
    sendable, _, settlement = policy.jobs(rows(3))
    too_large = sepp.MessageTooLargeError("too large")
    assert policy.send_failed(sendable, too_large, settlement).released == [0, 1, 2]
    assert policy.claim_limit() == 1
    sendable, _, settlement = policy.jobs(rows(1))
    assert [i for i, _ in policy.send_failed(sendable, too_large, settlement).rejected] == [0]
    assert policy.claim_limit() == 10


def test_a_row_changed_by_hand_is_rejected_not_sent() -> None:
    policy = RelayPolicy(10)
    broken = OutboxRow(9, ("q", "", None, None, "k", None, None, None, None))
    sendable, _, settlement = policy.jobs([broken, *rows(1)])
    assert [r.id for r in sendable] == [0]
    assert [i for i, _ in settlement.rejected] == [9]


def test_sqlite_claims_are_exclusive_until_they_expire(db: sqlite3.Connection) -> None:
    outbox = sepp.Outbox()
    for i in range(5):
        outbox.add(db, "q", "t", idempotency_key=f"k{i}")
    db.commit()
    path = db.execute("PRAGMA database_list").fetchone()[2]
    a, b = SqliteStore(path, "sepp_outbox"), SqliteStore(path, "sepp_outbox")
    first = a.claim(3, 60.0)
    second = b.claim(10, 60.0)
    assert [r.id for r in first.rows] == [1, 2, 3]  # oldest first
    assert [r.id for r in second.rows] == [4, 5]
    assert b.claim(10, 60.0).rows == []
    a.settle(first.token, [1], [(2, "nope")], [3])
    b.settle(first.token, [], [], [4])  # another claim's token releases nothing
    assert [r.id for r in b.claim(10, 60.0).rows] == [3]
    backlog = a.backlog()
    assert (backlog.waiting, backlog.rejected) == (3, 1)
    assert a.requeue_rejected() == 1
    expired = SqliteStore(path, "sepp_outbox").claim(10, 60.0)
    assert [r.id for r in expired.rows] == [2]
    db.execute("UPDATE sepp_outbox SET claimed_until = 0")
    db.commit()
    assert [r.id for r in a.claim(10, 60.0).rows] == [2, 3, 4, 5]


def test_the_commands_refuse_bad_arguments_before_touching_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sepp._cli import main

    assert main(["outbox", "status"]) == 2  # no --database
    assert main(["outbox", "relay", "--database", "mysql://db/x"]) == 2
    assert (
        main(["outbox", "init", "--database", f"sqlite:///{tmp_path}/a.db", "--table", "a b"]) == 2
    )
    assert not (tmp_path / "a.db").exists()
    assert main(["outbox", "init", "--print", "sqlite"]) == 0
    assert "CREATE TABLE IF NOT EXISTS sepp_outbox" in capsys.readouterr().out


def test_sqlite3_connections_are_known_on_pypy_too() -> None:
    # PyPy's sqlite3 classes are defined in `_sqlite3` (what CI's PyPy part met).
    from sepp._outbox import dialects

    assert dialects.dialect_of_module("_sqlite3") == dialects.SQLITE
    assert dialects.dialect_of_module("sqlite3.dbapi2") == dialects.SQLITE
    assert dialects.dialect_of_module("psycopg.connection") == dialects.POSTGRESQL
    assert dialects.dialect_of_module("pymysql.connections") is None


class AsyncCursor:
    """What an asyncio driver's cursor gives (psycopg's AsyncCursor): coroutines."""

    __module__ = "psycopg.cursor_async"

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def execute(self, sql: str, params: object) -> None:
        self.ran.append(sql)

    async def close(self) -> None:
        self.ran.append("close")


class AsyncConnection:
    __module__ = "psycopg.connection_async"

    def __init__(self) -> None:
        self.cursors: list[AsyncCursor] = []

    def cursor(self) -> AsyncCursor:
        self.cursors.append(AsyncCursor())
        return self.cursors[-1]


def test_add_refuses_an_asyncio_connection_whose_write_would_never_run(
    recwarn: pytest.WarningsRecorder,
) -> None:
    # Its execute() makes a coroutine: written without an await, the job would be lost.
    connection = AsyncConnection()
    for target in (connection, AsyncCursor()):
        with pytest.raises(sepp.ValidationError, match="is an asyncio connection") as caught:
            sepp.Outbox().add(target, "q", "t")
        assert caught.value.field == "connection"
    assert [cursor.ran for cursor in connection.cursors] == [[]]  # nothing ran, nothing left
    assert not [w for w in recwarn if "never awaited" in str(w.message)]
