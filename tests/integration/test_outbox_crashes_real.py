"""The outbox under crashes, with real processes: an application SIGKILLed right after its
commits, relays (`sepp-trio outbox relay`) SIGKILLed mid-batch, two relays on one table and
the sepp server down for a while, on a sqlite3 file and on PostgreSQL. At the end every job is
consumed: each committed order's job arrived exactly once, and no other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio
from fixtures import outbox as fixtures
from fixtures.outbox import connect, consume_all, drain_when_empty, once_each, rows_left, until

import sepp
from sepp.testing import SeppServer

database = fixtures.database
pg_cluster = fixtures.pg_cluster

APP = Path(__file__).resolve().parents[1] / "fixtures" / "outbox_app.py"


def committed_orders(url: str) -> list[str]:
    with connect(url) as conn:
        cur = conn.cursor()
        cur.execute("SELECT item FROM orders")
        items = [row[0] for row in cur.fetchall()]
        conn.rollback()
    return items


def start_relay(url: str, address: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "sepp", "outbox", "relay", "--database", url,
            "--address", address, "--claim-timeout", "2", "--batch-size", "20",
            "--poll-interval", "0.05", "--log-level", "warning", *extra,
        ],
    )  # fmt: skip


async def run_app_until(url: str, prefix: str, lines: int) -> list[str]:
    """Start the application, SIGKILL it right after its `lines`-th commit; what it printed."""
    app = await trio.lowlevel.open_process(
        [sys.executable, str(APP), url, prefix], stdout=subprocess.PIPE
    )
    assert app.stdout is not None
    printed: list[str] = []
    buffer = b""
    while len(printed) < lines:
        chunk = await app.stdout.receive_some(65536)
        assert chunk, "the application exited"
        buffer += chunk
        *done, buffer = buffer.split(b"\n")
        printed += [line.decode() for line in done]
    app.send_signal(signal.SIGKILL)
    await app.wait()
    return printed


def kill(process: subprocess.Popen[bytes]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


async def test_killed_applications_and_relays_and_a_server_down_lose_nothing_and_double_nothing(
    database: str, sepp_server: SeppServer
) -> None:
    address = sepp_server.address
    relays = [start_relay(database, address) for _ in range(2)]  # two relays on one table
    try:
        printed = await run_app_until(database, "a", 150)
        # A relay killed mid-batch (while rows are leaving), then another one, then both again.
        for round_ in range(3):
            before = rows_left(database)[0]
            add = await run_app_until(database, f"b{round_}", 60)
            printed += add
            await until(lambda b=before: rows_left(database)[0] < b + 60)
            kill(relays[round_ % 2])
            relays[round_ % 2] = start_relay(database, address)
        # The server down for a while: the application commits on, the relays back off.
        await sepp_server.stop()
        printed += await run_app_until(database, "c", 100)
        kill(relays[0])
        relays[0] = start_relay(database, address)
        await sepp_server.start()
        printed += await run_app_until(database, "d", 50)
        await drain_when_empty(database)
    finally:
        for relay in relays:
            kill(relay)
    orders = committed_orders(database)
    assert set(printed) <= set(orders)  # what the application saw committed is there
    jobs = await consume_all(address, ["orders"], len(orders))
    counts = once_each(jobs)
    assert set(counts) == set(orders)  # 0 lost, and no job for an order that is not there
    assert set(counts.values()) == {1}  # 0 twice
    assert rows_left(database) == (0, 0)


async def test_a_relay_killed_mid_batch_leaves_its_rows_to_the_next(
    database: str, sepp_server: SeppServer
) -> None:
    items = [f"i{n}" for n in range(400)]
    fixtures.add_orders(database, items)
    for _ in range(4):
        left = rows_left(database)[0]
        if not left:
            break  # the killed relays were quick: nothing left for the next one
        relay = start_relay(database, sepp_server.address, "--batch-size", "5")
        await until(lambda left=left: rows_left(database)[0] < left)
        kill(relay)  # while it sends the next batch, or settles one
    relay = start_relay(database, sepp_server.address)
    try:
        await drain_when_empty(database)
    finally:
        kill(relay)
    jobs = await consume_all(sepp_server.address, ["orders"], len(items))
    counts = once_each(jobs)
    assert set(counts) == set(items)
    assert set(counts.values()) == {1}


def test_outbox_commands(database: str, tmp_path: Path) -> None:
    run = [sys.executable, "-m", "sepp", "outbox"]
    status = subprocess.run(
        [*run, "status", "--database", database], capture_output=True, check=True
    )
    assert status.stdout.strip() == b'{"waiting": 0, "oldest_age_s": 0.0, "rejected": 0}'
    with connect(database) as conn:
        sepp.Outbox().add(conn, "orders", "ship", idempotency_key="k")
        conn.execute("UPDATE sepp_outbox SET state = 'rejected', rejection = 'test'")
        conn.commit()
    requeued = subprocess.run(
        [*run, "requeue-rejected", "--database", database], capture_output=True, check=True
    )
    assert requeued.stdout.strip() == b'{"requeued": 1}'
    assert rows_left(database) == (1, 0)
    fresh = f"sqlite:///{tmp_path}/new.db"
    subprocess.run([*run, "init", "--database", fresh], check=True)
    subprocess.run([*run, "init", "--database", fresh], check=True)  # twice: no harm
    assert rows_left(fresh) == (0, 0)
