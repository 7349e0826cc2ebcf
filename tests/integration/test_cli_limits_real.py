"""Global limits through the real command line: `sepp-trio worker --processes 2` beside two
separate `sepp-trio worker` processes (one on `--loop asyncio`) share one
`Limit(concurrency=1, scope="global")`, and no two runs overlap; a holder SIGKILLed mid-job
gives the limit back and every job runs; two tenants run in parallel and one never twice at
once; a global rate's starts stay within its bound. The handlers (plain `def` functions, so
the one app runs on either loop) stamp each start and end with the host's clock, one clock for
every process; outcomes are counted from those lines, never bounded by the clock."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import sepp
from sepp.testing import SeppServer, sepp_server
from tests.integration.test_cli_real import Running, spawn
from tests.integration.test_limits_processes_real import intervals, overlaps

# Processes that coordinate only through the server: the same on every interpreter (the
# Worker's limits, tests/integration/test_worker_limits_real.py, and the in-process gates run
# on every part), and 45 s of waiting a part: on the matrix's main part only.
pytestmark = [pytest.mark.real_server, pytest.mark.main_only]

HANG_GUARD_S = 240.0
CONFIG: dict[str, object] = {
    "admin": {"enabled": False},
    "storage": {"persist_mode": "sync_data", "dead_letter_retention_ms": 600_000},
}

APP = textwrap.dedent(
    """
    import json, os, time
    from pathlib import Path

    import sepp

    RUNS = Path(__file__).parent / "runs.jsonl"
    HOLD_S = float(os.environ.get("HOLD_S", "0.1"))

    def note(event, ctx, key=""):
        line = {
            "event": event,
            "id": str(ctx.custom.get("sepp.deferred.of", ctx.id)),
            "type": ctx.job_type,
            "key": key,
            "pid": os.getpid(),
            "t": time.time(),
            "attempt": ctx.attempt,
            "logical": ctx.logical_attempt,
        }
        with open(RUNS, "a") as f:  # one whole line per append, whichever process writes
            f.write(json.dumps(line) + "\\n")

    def run(ctx, key=""):
        note("start", ctx, key)
        time.sleep(HOLD_S)
        note("end", ctx, key)

    router = sepp.Router()

    @router.handler("one", limit=sepp.Limit(concurrency=1, scope="global", name="one", lease=2))
    def one(payload, ctx):
        run(ctx)

    by_tenant = sepp.Limit(
        concurrency=1, key=lambda ctx: ctx.custom["tenant"], scope="global", name="tenant", lease=2
    )

    @router.handler("tenant", limit=by_tenant)
    def tenant(payload, ctx):
        run(ctx, ctx.custom["tenant"])

    @router.handler("rated", limit=sepp.Limit(rate=4, per=1, scope="global", name="rated"))
    def rated(payload, ctx):
        note("start", ctx)
        note("end", ctx)
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "limits_app.py").write_text(APP)
    return tmp_path


def read(app_dir: Path) -> list[dict[str, Any]]:
    path = app_dir / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def wait_for(app_dir: Path, done: Callable[[list[dict[str, Any]]], bool]) -> None:
    with trio.fail_after(HANG_GUARD_S):
        while not done(read(app_dir)):  # noqa: ASYNC110 - other processes write the file
            await trio.sleep(0.1)


def ended(records: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["id"] for r in records if r["event"] == "end")


async def enqueue(server: SeppServer, job_type: str, custom: list[dict[str, Any]]) -> set[str]:
    async with sepp.open(server.address) as client:
        acks = await client.enqueue_batch(
            [sepp.EnqueueRequest("work", job_type, custom=c) for c in custom]
        )
    ids = {a.job_id for a in acks if isinstance(a, sepp.EnqueueAck)}
    assert len(ids) == len(custom)
    return ids


@asynccontextmanager
async def workers(
    server: SeppServer, app_dir: Path, *extra: tuple[str, ...], hold_s: float = 0.1
) -> AsyncIterator[list[Running]]:
    """One `sepp-trio worker limits_app:router` per entry of `extra` (its own options), each
    once it reserves; on leaving, each is stopped with SIGTERM and must exit 0."""
    async with AsyncExitStack() as stack:
        running = []
        for options in extra:
            args = ("worker", "limits_app:router", "--queue", "work", "--max-in-flight", "4")
            started = await stack.enter_async_context(
                spawn(server.address, *args, *options, cwd=app_dir, env={"HOLD_S": str(hold_s)})
            )
            running.append(started)
        for started in running:
            await started.wait_for("reserving from work")
        yield running
        for started in running:
            if started.process.returncode is None:
                started.send(signal.SIGTERM)
        for started in running:
            assert await started.wait(HANG_GUARD_S) in (0, -signal.SIGKILL), started.out


def assert_each_ran_once_at_attempt_1(records: list[dict[str, Any]], ids: set[str]) -> None:
    assert set(ended(records)) == ids and set(ended(records).values()) == {1}
    # Waiting (and being deferred, which makes copies) never cost an attempt.
    assert {(r["attempt"], r["logical"]) for r in records} == {(1, 1)}


async def test_a_supervised_group_and_two_workers_share_a_global_concurrency_of_one(
    app_dir: Path,
) -> None:
    async with sepp_server(CONFIG) as server:
        ids = await enqueue(server, "one", [{} for _ in range(30)])
        group = ("--processes", "2")
        async with workers(server, app_dir, group, (), ("--loop", "asyncio")) as running:
            await wait_for(app_dir, lambda records: set(ended(records)) == ids)
        for process in running:
            assert "waits for limit 'one'" in process.text("stderr")
    records = read(app_dir)
    assert_each_ran_once_at_attempt_1(records, ids)
    runs = intervals(records)[""]
    assert overlaps(runs) == 0
    assert len({pid for *_, pid in runs}) >= 3  # the group's children and the others took turns


async def test_a_sigkilled_holder_gives_the_limit_back_and_every_job_runs(app_dir: Path) -> None:
    async with sepp_server(CONFIG) as server:
        ids = await enqueue(server, "one", [{} for _ in range(10)])
        options = ("--lease", "2")
        async with workers(server, app_dir, options, options, hold_s=1.0) as running:

            def someone_holds(records: list[dict[str, Any]]) -> bool:
                open_runs = {(r["pid"], r["id"]) for r in records if r["event"] == "start"}
                open_runs -= {(r["pid"], r["id"]) for r in records if r["event"] == "end"}
                return sum(ended(records).values()) >= 2 and bool(open_runs)

            await wait_for(app_dir, someone_holds)
            records = read(app_dir)
            started = {(r["pid"], r["id"]) for r in records if r["event"] == "start"}
            (victim, _), *_ = started - {
                (r["pid"], r["id"]) for r in records if r["event"] == "end"
            }
            os.kill(victim, signal.SIGKILL)
            killed_at = time.time()
            await wait_for(app_dir, lambda records: set(ended(records)) == ids)
        assert {p.process.returncode for p in running} == {0, -signal.SIGKILL}
    records = read(app_dir)
    assert set(ended(records)) == ids  # the killed one's job too, run again by the survivor
    runs = intervals(records, {victim: killed_at})[""]
    assert overlaps(runs) == 0
    assert [start for start, _, pid in runs if pid != victim and start >= killed_at]


async def test_two_tenants_run_in_parallel_and_one_never_twice_at_once(app_dir: Path) -> None:
    async with sepp_server(CONFIG) as server:
        ids = await enqueue(server, "tenant", [{"tenant": t} for t in "ab" * 8])
        async with workers(server, app_dir, (), ("--loop", "asyncio"), hold_s=0.3):
            await wait_for(app_dir, lambda records: set(ended(records)) == ids)
    records = read(app_dir)
    assert_each_ran_once_at_attempt_1(records, ids)
    per_key = intervals(records)
    assert overlaps(per_key["a"]) == 0 and overlaps(per_key["b"]) == 0
    assert overlaps(per_key["a"] + per_key["b"]) > 0  # the tenants did not wait for each other


async def test_a_global_rate_across_processes_stays_within_its_bound(app_dir: Path) -> None:
    async with sepp_server(CONFIG) as server:
        ids = await enqueue(server, "rated", [{} for _ in range(24)])
        async with workers(server, app_dir, ("--processes", "2"), ()):
            await wait_for(app_dir, lambda records: set(ended(records)) == ids)
    records = read(app_dir)
    assert_each_ran_once_at_attempt_1(records, ids)
    starts = sorted(r["t"] for r in records if r["event"] == "start")
    # docs/limits.md: at most 4 grants in any second of the server's clock; a handler starts
    # after its grant by the time an answer takes to reach its process, so starts are counted
    # in windows that much shorter.
    window = 1.0 - 0.25
    assert max(sum(1 for s in starts if t <= s < t + window) for t in starts) <= 4
    assert starts[-1] - starts[0] >= 5 * 0.99  # 24 starts at 4 a second: 5 whole windows
