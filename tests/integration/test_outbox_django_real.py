"""A Django project under gunicorn (real worker processes) whose view saves an order and adds
its job to the outbox in one `transaction.atomic()`, on sqlite3 and on PostgreSQL, with the
sepp server down while the first orders come in and a relay process forwarding them: every
committed order's job arrives exactly once, and a view that fails after add() leaves neither
the order nor its job."""

from __future__ import annotations

import collections
import contextlib
import functools
import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import trio
from fixtures import outbox as fixtures
from fixtures.outbox import connect, consume_all, drain_when_empty, once_each, rows_left, until

from sepp.testing import SeppServer

database = fixtures.database
pg_cluster = fixtures.pg_cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def post(sock: str, fields: dict[str, str]) -> int:
    conn = UnixHTTPConnection(sock)
    try:
        conn.request(
            "POST",
            "/order",
            body=urllib.parse.urlencode(fields),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def spawn(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env)


def serving(sock: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(sock)
        return True
    except OSError:
        return False


async def test_a_django_view_under_gunicorn_adds_each_committed_orders_job_once(
    database: str, sepp_server: SeppServer, tmp_path: Path
) -> None:
    sock = str(tmp_path / "gunicorn.sock")
    env = {**os.environ, "OUTBOX_TEST_DATABASE": database}
    env["PYTHONPATH"] = os.pathsep.join([str(FIXTURES), env.get("PYTHONPATH", "")])
    gunicorn = spawn(
        [sys.executable, "-m", "gunicorn", "--workers", "3", "--bind", f"unix:{sock}",
         "--log-level", "warning", "outbox_django_site:application"],
        env=env,
    )  # fmt: skip
    relay = None
    try:
        await until(lambda: serving(sock))
        await sepp_server.stop()  # the server is down while the first orders come in

        def orders(prefix: str, n: int) -> list[int]:
            return [post(sock, {"item": f"{prefix}-{i}"}) for i in range(n)]

        statuses = await trio.to_thread.run_sync(orders, "down", 60)
        failed = await trio.to_thread.run_sync(post, sock, {"item": "rolled-back", "fail": "1"})
        relay = spawn(
            [sys.executable, "-m", "sepp", "outbox", "relay", "--database", database,
             "--address", sepp_server.address, "--log-level", "warning"],
        )  # fmt: skip
        assert rows_left(database) == (60, 0)
        await sepp_server.start()
        statuses += await trio.to_thread.run_sync(orders, "up", 60)
        await drain_when_empty(database)
    finally:
        for process in (gunicorn, relay):
            if process is not None:
                process.kill()
                process.wait()
    assert statuses == [201] * 120
    assert failed == 500
    jobs = await consume_all(sepp_server.address, ["orders"], 120)
    counts = once_each(jobs)
    expected = {f"{p}-{i}" for p in ("down", "up") for i in range(60)}
    assert set(counts) == expected  # "rolled-back" neither saved nor sent
    assert set(counts.values()) == {1}


# How long the server stays down in the test below: at least a minute on the main part of the
# matrix (scripts/test_matrix.py sets it), a few seconds elsewhere, where the same paths run.
OUTAGE_S = float(os.environ.get("SEPP_TEST_OUTBOX_OUTAGE_S", "5"))


def start_gunicorn(sock: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    # A session of its own: SIGKILL to the group takes the master and its workers at once.
    return subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--workers", "2", "--bind", f"unix:{sock}",
         "--log-level", "critical", "outbox_django_site:application"],
        env=env, start_new_session=True,
    )  # fmt: skip


def start_relay(database: str, address: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sepp", "outbox", "relay", "--database", database,
         "--address", address, "--claim-timeout", "2", "--batch-size", "20",
         "--poll-interval", "0.05", "--log-level", "warning"],
        start_new_session=True,
    )  # fmt: skip


def kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def committed_orders(database: str) -> list[str]:
    with connect(database) as conn:
        cur = conn.cursor()
        cur.execute("SELECT item FROM orders")
        items = [row[0] for row in cur.fetchall()]
        conn.rollback()
    return items


async def test_orders_through_a_long_outage_with_the_app_and_the_relay_killed_at_random(
    database: str, sepp_server: SeppServer, tmp_path: Path
) -> None:
    """The sepp server down for OUTAGE_S while orders keep coming, gunicorn (master and
    workers) and the relay SIGKILLed at random moments, orders in flight included: afterwards
    every committed order has its job exactly once, and no other job exists."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    sock = str(tmp_path / "gunicorn.sock")
    env = {**os.environ, "OUTBOX_TEST_DATABASE": database}
    env["PYTHONPATH"] = os.pathsep.join([str(FIXTURES), env.get("PYTHONPATH", "")])
    app = start_gunicorn(sock, env)
    relay = start_relay(database, sepp_server.address)
    answers: collections.Counter[int | str] = collections.Counter()
    kills: collections.Counter[str] = collections.Counter()
    posting = True

    def keep_ordering() -> None:
        n = 0
        while posting:
            n += 1
            try:
                answers[post(sock, {"item": f"order-{n}"})] += 1
            except (OSError, http.client.HTTPException) as exc:  # the application is down or
                # was killed mid-answer: its orders fail, as they would (and may have committed)
                answers[type(exc).__name__] += 1
                time.sleep(0.02)

    try:
        await until(lambda: serving(sock))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(trio.to_thread.run_sync, keep_ordering))
            await until(lambda: answers[201] >= 10)
            await sepp_server.stop(kill=True)
            down_since = trio.current_time()
            round_ = 0
            while round_ < 2 or trio.current_time() - down_since < OUTAGE_S:  # at least
                round_ += 1
                await trio.sleep(rng.uniform(0.2, 1.0) * max(1.0, OUTAGE_S / 15))
                victim = (
                    ("app", "relay")[round_ % 2]
                    if round_ <= 2
                    else rng.choice(("app", "relay", "both"))
                )
                if victim in ("app", "both"):
                    await trio.to_thread.run_sync(kill_group, app)
                    app = start_gunicorn(sock, env)
                    kills["app"] += 1
                if victim in ("relay", "both"):
                    await trio.to_thread.run_sync(kill_group, relay)
                    relay = start_relay(database, sepp_server.address)
                    kills["relay"] += 1
                await until(lambda: serving(sock))
            await sepp_server.start()
            settled = answers[201]
            await until(lambda: answers[201] >= settled + 10)  # orders go on once it is back
            posting = False
        while rows_left(database)[0]:  # the relay forwards the rest; it must not die on it
            assert relay.poll() is None, f"the relay exited with {relay.returncode}"
            await trio.sleep(0.05)
    finally:
        posting = False
        for process in (app, relay):
            await trio.to_thread.run_sync(kill_group, process)

    committed = committed_orders(database)
    jobs = await consume_all(sepp_server.address, ["orders"], len(committed))
    counts = once_each(jobs)
    report = f"seed {seed}, kills {dict(kills)}, answers {dict(answers)}"
    assert kills["app"] >= 1 and kills["relay"] >= 1, report
    assert len(committed) >= answers[201] >= 20, report  # an order cut off may still commit
    assert sorted(counts) == sorted(committed), report  # none lost, none for a rollback
    assert set(counts.values()) == {1}, report  # none twice
