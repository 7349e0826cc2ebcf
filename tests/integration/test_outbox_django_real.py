"""A Django project under gunicorn (real worker processes) whose view saves an order and adds
its job to the outbox in one `transaction.atomic()`, on sqlite3 and on PostgreSQL, with the
sepp server down while the first orders come in and a relay process forwarding them: every
committed order's job arrives exactly once, and a view that fails after add() leaves neither
the order nor its job."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import trio
from fixtures import outbox as fixtures
from fixtures.outbox import consume_all, drain_when_empty, once_each, rows_left, until

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
