"""`sepp-trio worker --processes N` run as a subprocess against the real server: the jobs run in
every child, a killed child is replaced and its job runs again after its lease, a SIGTERM stops
the group with every job settled, a crash loop stops it with a clear error, and the group's
probes and metrics speak for every child. Ordered by events (log lines, the app's own notes,
probe answers), never by the clock."""

from __future__ import annotations

import os
import re
import signal
import textwrap
from pathlib import Path

import pytest
import trio

import sepp
from sepp.testing import SeppServer
from tests.integration.test_cli_real import TIMEOUT_S, Running, spawn
from tests.integration.test_cli_worker_ops_real import http_get, metric

APP = textwrap.dedent(
    """
    import contextlib, os, signal, time
    from pathlib import Path

    import sepp

    NOTES = Path(__file__).parent / "notes.txt"

    def note(*words):
        with open(NOTES, "a") as f:  # appends of a line: whole, whichever process writes
            f.write(" ".join(map(str, words)) + "\\n")

    def notes(word):
        text = NOTES.read_text() if NOTES.exists() else ""
        return [line.split()[1:] for line in text.splitlines() if line.split()[0] == word]

    @contextlib.asynccontextmanager
    async def lifespan(worker):
        if os.environ.get("CRASH_AT_START"):
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
        note("open", os.getpid())
        yield
        note("closed", os.getpid())

    router = sepp.Router(lifespan=lifespan)

    @router.handler("meet")
    def meet(payload, ctx):
        # Holds its process's one slot until a job runs in another process.
        note("meet", os.getpid())
        deadline = time.monotonic() + 60
        while len({pid for pid, in notes("meet")}) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        note("done", ctx.id, os.getpid())

    @router.handler("burn")
    def burn(payload, ctx):
        end = time.process_time() + 0.01
        while time.process_time() < end:
            pass
        note("done", ctx.id, os.getpid())

    @router.handler("hold")
    def hold(payload, ctx):
        note("hold", ctx.id, os.getpid(), ctx.attempt)
        if ctx.attempt == 1:
            time.sleep(3600)  # until its process is killed
        note("done", ctx.id, os.getpid())

    empty = sepp.Router()
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "fleet_app.py").write_text(APP)
    return tmp_path


def notes(app_dir: Path, word: str) -> list[list[str]]:
    path = app_dir / "notes.txt"
    text = path.read_text() if path.exists() else ""
    return [line.split()[1:] for line in text.splitlines() if line.split()[0] == word]


async def wait_notes(app_dir: Path, word: str, count: int) -> list[list[str]]:
    """The app's notes of `word` once there are `count` (polled: the children write them)."""
    with trio.fail_after(TIMEOUT_S):
        while True:
            found = notes(app_dir, word)
            if len(found) >= count:
                return found
            await trio.sleep(0.05)


def child_pids(running: Running) -> list[int]:
    """The pids the supervisor started, in the order it logged them."""
    return [pid for pid, _ in started(running)]


def started(running: Running) -> list[tuple[int, int]]:
    """(pid, child index) of each process the supervisor started, in the order it logged."""
    found = re.findall(r"child (\d+) started: pid (\d+)", running.text("stderr"))
    return [(int(pid), int(index)) for index, pid in found]


async def group_port(running: Running, what: str) -> int:
    fragment = f"serving {what} on 127.0.0.1:"
    await running.wait_for(" started: pid ")  # it serves before it starts a child
    match = re.search(rf"{re.escape(fragment)}(\d+) \(for the", running.text("stderr"))
    assert match, running.out
    return int(match.group(1))


async def eventually(port: int, path: str, check: object) -> tuple[int, str]:
    with trio.fail_after(TIMEOUT_S):
        while True:
            answer = await http_get(port, path)
            if callable(check) and check(*answer):
                return answer
            await trio.sleep(0.05)


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
async def test_two_processes_share_the_jobs_serve_the_group_and_stop_with_every_job_settled(
    sepp_server: SeppServer, app_dir: Path, loop: str
) -> None:
    args = (
        *("worker", "fleet_app:router", "--queue", "work", "--processes", "2", "--loop", loop),
        *("--max-in-flight", "1", "--health-port", "0", "--metrics-port", "0"),
        *("--http-host", "127.0.0.1"),
    )
    async with spawn(sepp_server.address, *args, cwd=app_dir) as running:
        health = await group_port(running, "/healthz /readyz")
        metrics = await group_port(running, "/metrics")
        await running.wait_for(") is worker ", count=2)  # both reserving
        first, second = child_pids(running)
        pid_of = {index: pid for pid, index in started(running)}
        status, body = await eventually(health, "/readyz", lambda status, body: status == 200)
        lag = r" \(loop lag \d+\.\d{3}s\)"
        assert re.fullmatch(
            f"ok: child 0 \\(pid {pid_of[0]}\\): reserving{lag};"
            f" child 1 \\(pid {pid_of[1]}\\): reserving{lag}\n",
            body,
        ), body
        assert (await http_get(health, "/healthz"))[0] == 200

        async with sepp.open(sepp_server.address) as client:
            # Each child has one slot and each "meet" job holds it until the other runs one:
            # both processes run jobs, whatever order they reserve in.
            meets = [(await client.enqueue("work", "meet")).job_id for _ in range(2)]
            burns = [(await client.enqueue("work", "burn")).job_id for _ in range(20)]
            done = await wait_notes(app_dir, "done", 22)
        assert {job_id for job_id, _ in done} == {*meets, *burns}
        assert {int(pid) for _, pid in done} == {first, second}
        assert sorted(int(pid) for (pid,) in notes(app_dir, "open")) == sorted([first, second])

        def all_counted(status: int, body: str) -> bool:
            counted = 0.0
            for index in (0, 1):
                labels = f'{{process="{index}",queue="work",job_type="burn"}}'
                try:
                    counted += metric(body, f"sepp_worker_jobs_succeeded_total{labels}")
                except AssertionError:
                    pass
            return counted == 20

        _, body = await eventually(metrics, "/metrics", all_counted)
        assert body.count("# TYPE sepp_worker_jobs_succeeded_total counter") == 1
        assert metric(body, 'sepp_worker_process_up{process="0"}') == 1
        assert metric(body, 'sepp_worker_process_up{process="1"}') == 1
        assert metric(body, 'sepp_worker_process_restarts_total{process="1"}') == 0
        assert metric(body, 'sepp_worker_ready{process="0"}') == 1

        running.send(signal.SIGTERM)
        status = await running.wait()
    assert status == 0, running.out
    assert "all 2 worker processes stopped" in running.text("stderr")
    assert sorted(int(pid) for (pid,) in notes(app_dir, "closed")) == sorted([first, second])
    async with sepp.open(sepp_server.address) as client:
        assert not await client.reserve("work", lease_duration=5, wait_timeout=0)


async def test_a_killed_child_is_replaced_and_its_job_runs_again_after_its_lease(
    sepp_server: SeppServer, app_dir: Path
) -> None:
    args = (
        *("worker", "fleet_app:router", "--queue", "work", "--processes", "2"),
        *("--lease", "1", "--health-port", "0", "--http-host", "127.0.0.1"),
    )
    async with spawn(sepp_server.address, *args, cwd=app_dir) as running:
        health = await group_port(running, "/healthz /readyz")
        await running.wait_for(") is worker ", count=2)
        async with sepp.open(sepp_server.address) as client:
            held = (await client.enqueue("work", "hold")).job_id
            [[job_id, pid, attempt]] = await wait_notes(app_dir, "hold", 1)
            assert (job_id, attempt) == (held, "1")
            victim = int(pid)
            index = dict(started(running))[victim]
            os.kill(victim, signal.SIGKILL)
            await running.wait_for(f"child {index} (pid {victim}) was killed by SIGKILL")
            await running.wait_for(") is worker ", count=3)  # the replacement reserves
            replacement = child_pids(running)[-1]
            assert replacement not in (victim, *child_pids(running)[:2])
            # The job comes back when the lease of the killed child's run expires.
            [_, [job_id2, pid2, attempt2]] = await wait_notes(app_dir, "hold", 2)
            assert (job_id2, attempt2) == (held, "2") and int(pid2) != victim
            await wait_notes(app_dir, "done", 1)
        _, body = await eventually(health, "/readyz", lambda status, body: status == 200)
        assert f"child {index} (pid {replacement}): reserving" in body

        running.send(signal.SIGTERM)
        status = await running.wait()
    assert status == 0, running.out
    assert "all 2 worker processes stopped" in running.text("stderr")


async def test_a_crash_loop_stops_the_group_with_a_clear_error(
    sepp_server: SeppServer, app_dir: Path
) -> None:
    args = ("worker", "fleet_app:router", "--queue", "work", "--processes", "2")
    async with spawn(
        sepp_server.address, *args, cwd=app_dir, env={"CRASH_AT_START": "1"}
    ) as running:
        status = await running.wait()
    assert status == 1, running.out
    stderr = running.text("stderr")
    assert "was killed by SIGKILL unexpectedly" in stderr
    assert re.search(r"stopped: crash loop: .*was killed by SIGKILL", stderr), stderr
    assert "starting another in" in stderr  # it did try again, with a backoff


async def test_a_usage_error_in_the_children_stops_the_group_at_once(app_dir: Path) -> None:
    args = ("worker", "fleet_app:empty", "--queue", "work", "--processes", "2")
    async with spawn("127.0.0.1:1", *args, cwd=app_dir) as running:
        status = await running.wait()
    assert status == 2, running.out
    stderr = running.text("stderr")
    assert "fleet_app:empty has no handlers" in stderr
    assert "a usage error, which no restart fixes" in stderr
    assert "starting another" not in stderr


async def test_sigterm_mid_run_stops_every_child_with_each_job_done_or_back_in_the_queue(
    sepp_server: SeppServer, app_dir: Path
) -> None:
    args = ("worker", "fleet_app:router", "--queue", "work", "--processes", "2")
    async with spawn(sepp_server.address, *args, "--max-in-flight", "2", cwd=app_dir) as running:
        await running.wait_for(") is worker ", count=2)
        async with sepp.open(sepp_server.address) as client:
            jobs = {(await client.enqueue("work", "burn")).job_id for _ in range(60)}
            await wait_notes(app_dir, "done", 10)
            running.send(signal.SIGTERM)
            status = await running.wait()
            assert status == 0, running.out
            assert "all 2 worker processes stopped" in running.text("stderr")
            done = {job_id for job_id, _ in notes(app_dir, "done")}
            # Every job not done is reservable now, not after a lease of the stopped workers.
            back: set[str] = set()
            while got := await client.reserve("work", lease_duration=30, wait_timeout=0.5):
                back |= {job.id for job in got}
    assert done | back == jobs and not done & back
