"""Issue 48's "done when": a user's handler tests — enqueues, a Worker, retries, leases and a
scheduled job — run in a fresh virtualenv holding only the built wheel, pytest and pytest-trio
(no Rust, no server binary), on `sepp.testing`'s memory server under trio's MockClock.

The virtualenv's pytest runs with no SEPP_BIN, a PATH without any `sepp`, and a HOME where the
project's cache of the server is not; the user's conftest records every process the run
starts. What is asserted is what ran (each test's outcome and what its handlers saw) and that
no process was started, never how long it took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest
from test_distribution import ROOT, build

pytestmark = pytest.mark.memory_server

CONFTEST = """
import json, os, subprocess

import pytest

pytest_plugins = ["sepp.testing.pytest_plugin"]
STARTED = []
_popen = subprocess.Popen.__init__


def _record(self, args, *rest, **kw):
    STARTED.append(args if isinstance(args, str) else [str(a) for a in args])
    return _popen(self, args, *rest, **kw)


subprocess.Popen.__init__ = _record
SEEN = {}


@pytest.fixture
def seen():
    return SEEN


def pytest_sessionfinish(session):
    with open(os.environ["RESULTS"], "w") as out:
        json.dump({"started": STARTED, "seen": SEEN}, out)
"""

# The user's tests proper: plain pytest-trio tests on the fixture.
TESTS = """
from datetime import timedelta

import trio
import sepp
from sepp import HandlerError

LOG = []
router = sepp.Router()


@router.handler("welcome")
async def welcome(payload, ctx):
    LOG.append(["welcome", payload.json()["user"], ctx.attempt])


@router.handler("charge")
async def charge(payload, ctx):
    LOG.append(["charge", ctx.attempt])
    if ctx.attempt < 3:
        raise HandlerError.retry_after("card network down", timedelta(minutes=5))


@router.handler("slow")
async def slow(payload, ctx):
    LOG.append(["slow", ctx.attempt])
    if ctx.attempt == 1:
        await trio.sleep(3600)  # far past its lease: cut off, then redelivered


async def work(client, **options):
    await sepp.Worker(client, "app", handlers=router, **options).run(until_idle=True)


async def test_a_welcome_email_is_sent(memory_server, autojump_clock, seen):
    LOG.clear()
    async with sepp.open(memory_server.address) as client:
        welcome = sepp.EnqueueRequest("app", "welcome", payload=sepp.Payload.json({"user": 7}))
        await client.enqueue(welcome)
        await work(client)
    seen["welcome"] = list(LOG)
    assert LOG == [["welcome", 7, 1]]


async def test_a_charge_is_retried_until_it_goes_through(memory_server, autojump_clock, seen):
    LOG.clear()
    async with sepp.open(memory_server.address) as client:
        await client.enqueue(sepp.EnqueueRequest("app", "charge", max_attempts=5))
        for _ in range(3):
            await work(client)
            await memory_server.advance(timedelta(minutes=5))
    seen["charge"] = list(LOG)
    assert LOG == [["charge", 1], ["charge", 2], ["charge", 3]]
    assert memory_server.depths("app") == sepp.testing.QueueDepths()


async def test_a_stuck_handler_loses_its_lease_and_the_job_comes_back(
    memory_server, autojump_clock, seen
):
    LOG.clear()
    async with sepp.open(memory_server.address) as client:
        await client.enqueue(sepp.EnqueueRequest("app", "slow"))
        await work(client, lease_duration=30, auto_extend=False)
    seen["slow"] = list(LOG)
    assert LOG == [["slow", 1], ["slow", 2]]


async def test_a_reminder_scheduled_in_30_days_runs_then(memory_server, autojump_clock, seen):
    LOG.clear()
    start = memory_server.now()
    async with sepp.open(memory_server.address) as client:
        await client.enqueue(
            sepp.EnqueueRequest(
                "app", "welcome", payload=sepp.Payload.json({"user": 9}),
                scheduled_at=start + timedelta(days=30),
            )
        )
        await work(client)
        assert LOG == []  # not due yet
        await memory_server.advance(timedelta(days=30))
        await work(client)
    seen["reminder"] = [list(LOG), (memory_server.now() - start).days]
    assert LOG == [["welcome", 9, 1]]
"""


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = tmp_path_factory.mktemp("wheel")
    (wheel,) = build(ROOT, wheels, "--wheel")
    home = tmp_path_factory.mktemp("venv")
    venv.create(home / "v", with_pip=True)
    python = home / "v" / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel), "pytest", "pytest-trio"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def test_handler_tests_run_on_the_wheel_alone_with_no_server_binary(
    fresh_venv: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (project / "test_handlers.py").write_text(textwrap.dedent(TESTS))
    (project / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    results = tmp_path / "results.json"
    env = {
        "PATH": f"{fresh_venv.parent}:/usr/bin:/bin",  # the venv's tools; no sepp, no cargo
        "HOME": str(tmp_path / "home"),  # not the home whose cache holds the server
        "RESULTS": str(results),
        "LANG": "C.UTF-8",
    }
    assert "SEPP_BIN" not in env
    done = subprocess.run(
        [str(fresh_venv), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout, done.stdout
    print(done.stdout.strip().splitlines()[-1])  # pytest's own line, with its time
    found = subprocess.run(
        [str(fresh_venv), "-c", "import shutil, sepp; print(shutil.which('sepp'), sepp.__file__)"],
        env=env,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert found[0] == "None" and str(fresh_venv.parent.parent) in found[1]  # the wheel's sepp
    report = json.loads(results.read_text())
    assert report["started"] == []  # not a process, so no server binary
    assert report["seen"] == {
        "welcome": [["welcome", 7, 1]],
        "charge": [["charge", 1], ["charge", 2], ["charge", 3]],
        "slow": [["slow", 1], ["slow", 2]],
        "reminder": [[["welcome", 9, 1]], 30],
    }
    assert sys.executable != str(fresh_venv) and not os.path.exists(fresh_venv.parent / "sepp")
