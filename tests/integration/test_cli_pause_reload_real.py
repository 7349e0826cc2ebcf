"""`sepp-trio worker` paused and resumed by signals (SIGUSR1, SIGUSR2), alone and under
`--processes 2` (the supervisor passes them on, and starts a replaced child paused), and
`--reload`: an edit to the target's package replaces the worker, the next jobs run the new
code, and no job is lost or run twice. Run as subprocesses against the real server, ordered by
events (log lines, the app's notes, probe answers), never by the clock."""

from __future__ import annotations

import os
import signal
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import trio

import sepp
from sepp.testing import SeppServer
from tests.integration.test_cli_processes_real import child_pids, group_port
from tests.integration.test_cli_real import TIMEOUT_S, Running, spawn
from tests.integration.test_cli_worker_ops_real import http_get, served_port

QUEUE = "work"
JOBS = textwrap.dedent(
    """
    import os, time
    from pathlib import Path

    import sepp

    from .version import VERSION

    NOTES = Path(__file__).parent.parent / "notes.txt"
    router = sepp.Router()

    @router.handler("note")
    def note(payload, ctx):
        time.sleep(0.1)  # so that a reload finds a job running now and then
        with open(NOTES, "a") as f:  # appends of a line: whole, whichever process writes
            f.write(f"ran {VERSION} {ctx.id} {ctx.attempt} {os.getpid()}\\n")
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    package = tmp_path / "relapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "version.py").write_text('VERSION = "v1"\n')
    (package / "jobs.py").write_text(JOBS)
    return tmp_path


def ran(app_dir: Path) -> list[tuple[str, str, int]]:
    """(version, job id, attempt) of every job the app ran, in order."""
    path = app_dir / "notes.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(words[1], words[2], int(words[3])) for words in map(str.split, lines)]


async def wait_ran(app_dir: Path, count: int) -> list[tuple[str, str, int]]:
    with trio.fail_after(TIMEOUT_S):
        while len(found := ran(app_dir)) < count:  # noqa: ASYNC110 (the app writes a file)
            await trio.sleep(0.05)
    return found


async def enqueue(address: str, count: int) -> list[str]:
    async with sepp.open(address) as client:
        return [(await client.enqueue(QUEUE, "note")).job_id for _ in range(count)]


async def nothing_runs_until_resumed(
    running: Running, address: str, app_dir: Path, *, processes: int
) -> None:
    """Jobs enqueued while paused wait in the queue; SIGUSR2 resumes every process, and each
    job runs once."""
    ids = await enqueue(address, 2 * processes)
    await trio.sleep(0.5)  # a paused worker that still reserved would run one now
    assert ran(app_dir) == []
    running.send(signal.SIGUSR2)
    await running.wait_for("resumed: reserving again", count=processes)
    found = await wait_ran(app_dir, len(ids))
    assert sorted(job_id for _, job_id, _ in found) == sorted(ids)


async def test_sigusr1_pauses_the_worker_and_sigusr2_resumes_it(
    sepp_server: SeppServer, app_dir: Path
) -> None:
    args = ("worker", "relapp.jobs:router", "--queue", QUEUE, "--max-in-flight", "1")
    args += ("--health-port", "0", "--http-host", "127.0.0.1")
    async with spawn(sepp_server.address, *args, cwd=app_dir) as running:
        port = await served_port(running, "/healthz /readyz")
        await running.wait_for("reserving from")
        running.send(signal.SIGUSR1)
        await running.wait_for("paused: reserving no more jobs")
        status, body = await http_get(port, "/readyz")
        assert (status, body.splitlines()[0]) == (503, "not ready: paused")
        assert (await http_get(port, "/healthz"))[0] == 200  # live: paused is not stuck
        await nothing_runs_until_resumed(running, sepp_server.address, app_dir, processes=1)
        assert (await http_get(port, "/readyz"))[0] == 200
        running.send(signal.SIGTERM)
        assert await running.wait() == 0
    assert "SIGUSR1: pausing" in running.text("stderr")


async def test_the_supervisor_passes_pause_on_and_starts_a_replaced_child_paused(
    sepp_server: SeppServer, app_dir: Path
) -> None:
    args = ("worker", "relapp.jobs:router", "--queue", QUEUE, "--processes", "2")
    args += ("--health-port", "0", "--http-host", "127.0.0.1")
    async with spawn(sepp_server.address, *args, cwd=app_dir) as running:
        port = await group_port(running, "/healthz /readyz")
        await running.wait_for(") is worker ", count=2)  # both reserving
        running.send(signal.SIGUSR1)
        await running.wait_for("paused: reserving no more jobs", count=2)
        first, _second = child_pids(running)
        os.kill(first, signal.SIGKILL)  # replaced while the group is paused: starts paused
        await running.wait_for(" started: pid ", count=3)
        await running.wait_for("; paused (SIGUSR2 resumes)")
        await running.wait_for("paused: reserving no more jobs", count=3)
        status, body = await http_get(port, "/readyz")
        assert status == 503 and body.count(": paused") == 2, body
        await nothing_runs_until_resumed(running, sepp_server.address, app_dir, processes=2)
        running.send(signal.SIGTERM)
        assert await running.wait() == 0
    assert "SIGUSR1: pausing; passing it on to 2 worker process(es)" in running.text("stderr")


async def test_reload_replaces_the_worker_and_the_next_jobs_run_the_new_code_once_each(
    sepp_server: SeppServer, app_dir: Path
) -> None:
    args = ("worker", "relapp.jobs:router", "--queue", QUEUE, "--reload", "--max-in-flight", "1")
    writes_bytecode = {"PYTHONDONTWRITEBYTECODE": ""}  # empty is unset: the app's .pyc written
    async with spawn(sepp_server.address, *args, env=writes_bytecode, cwd=app_dir) as running:
        await running.wait_for("for changes")
        await running.wait_for(") is worker ")
        ids = await enqueue(sepp_server.address, 12)
        await wait_ran(app_dir, 2)  # the rest wait in the queue, one held at a time
        version = app_dir / "relapp" / "version.py"
        version.write_text('VERSION = "v2"\n')
        stamp = os.stat(version).st_mtime_ns + 2_000_000_000  # a coarse clock still sees it
        os.utime(version, ns=(stamp, stamp))
        await running.wait_for("version.py changed: replacing 1 worker process(es)")
        await running.wait_for(") is worker ", count=2)  # the new one reserves
        ids += await enqueue(sepp_server.address, 1)  # enqueued after: runs the new code
        found = await wait_ran(app_dir, len(ids))
        # A broken edit: the new process cannot import it, and waits for the next change.
        version.write_text("VERSION = \n")
        await running.wait_for("waiting for a change to the source")
        # v3: the size of v2 and, here, its mtime too, so that v2's .pyc would pass as fresh
        # (Python checks whole seconds and size); the reload drops it.
        version.write_text('VERSION = "v3"\n')
        os.utime(version, ns=(stamp, stamp))
        await running.wait_for(") is worker ", count=3)
        ids += await enqueue(sepp_server.address, 1)
        found = await wait_ran(app_dir, len(ids))
        running.send(signal.SIGTERM)
        assert await running.wait() == 0
    # Every job ran exactly once, on its first attempt (none stranded, none returned twice).
    assert Counter(job_id for _, job_id, _ in found) == Counter(ids)
    assert {attempt for _, _, attempt in found} == {1}
    versions = [v for v, _, _ in found]
    assert versions[:2] == ["v1", "v1"] and versions[-2:] == ["v2", "v3"]
    assert versions == sorted(versions)  # v1 until the reload, v2 after it, never mixed
