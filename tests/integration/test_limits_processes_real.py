"""Global limits across processes against the real server: separate Python processes
(tests/fixtures/limit_process.py) take work jobs and admit each through one shared limit;
their starts and ends, stamped with the host's clock, are counted for overlaps. One holder is
SIGKILLed in the middle of a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import trio

import sepp
from sepp.testing import SeppServer, sepp_server

# Processes that coordinate only through the server: the same on every interpreter (the
# in-process gates, tests/integration/test_limits_global_real.py, run on every part), and
# 40 s of waiting a part: on the matrix's main part only.
pytestmark = [pytest.mark.real_server, pytest.mark.main_only]

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "limit_process.py"
HANG_GUARD_S = 180.0
BASE: dict[str, object] = {
    "admin": {"enabled": False},
    "storage": {"persist_mode": "sync_data", "dead_letter_retention_ms": 600_000},
}


def start_processes(
    server: SeppServer, spec: dict[str, Any], count: int, output: Path
) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), server.address, json.dumps(spec), str(output)],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def read(output: Path) -> list[dict[str, Any]]:
    if not output.exists():
        return []
    return [json.loads(line) for line in output.read_text().splitlines() if line.strip()]


async def wait_for(condition: Any, output: Path) -> list[dict[str, Any]]:
    with trio.fail_after(HANG_GUARD_S):
        while True:
            records = read(output)
            if condition(records):
                return records
            await trio.sleep(0.1)


async def finish(processes: list[subprocess.Popen[bytes]]) -> list[int]:
    with trio.fail_after(HANG_GUARD_S):
        return [await trio.to_thread.run_sync(p.wait, abandon_on_cancel=True) for p in processes]


def intervals(
    records: list[dict[str, Any]], killed: dict[int, float] | None = None
) -> dict[str, list[tuple[float, float, int]]]:
    """Per key: (start, end, pid) of every run; a run of a killed process ends at the kill."""
    starts: dict[tuple[int, str], dict[str, Any]] = {}
    out: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for r in records:
        if r["event"] == "start":
            starts[(r["pid"], r["id"])] = r
        elif r["event"] == "end":
            s = starts.pop((r["pid"], r["id"]))
            out[r["key"]].append((s["t"], r["t"], r["pid"]))
    for (pid, _), s in starts.items():
        assert killed is not None and pid in killed, "a run that never ended"
        out[s["key"]].append((s["t"], killed[pid], pid))
    return out


def overlaps(runs: list[tuple[float, float, int]]) -> int:
    ordered = sorted(runs)
    return sum(
        1 for n, (start, _, _) in enumerate(ordered) for _, end, _ in ordered[:n] if start < end
    )


async def enqueue_work(server: SeppServer, custom: list[dict[str, Any]]) -> set[str]:
    async with sepp.open(server.address) as client:
        acks = await client.enqueue_batch(
            [sepp.EnqueueRequest("work", "w", custom=c) for c in custom]
        )
    ids = {a.job_id for a in acks if isinstance(a, sepp.EnqueueAck)}
    assert len(ids) == len(custom)
    return ids


def ended_ids(records: list[dict[str, Any]]) -> set[str]:
    return {r["id"] for r in records if r["event"] == "end"}


async def test_processes_sharing_a_global_concurrency_of_one_never_overlap(
    tmp_path: Path,
) -> None:
    output = tmp_path / "runs.jsonl"
    async with sepp_server(BASE) as server:
        ids = await enqueue_work(server, [{} for _ in range(30)])
        spec = {"name": "single", "concurrency": 1, "hold": 0.05, "lease": 3.0}
        processes = start_processes(server, spec, 3, output)
        assert await finish(processes) == [0, 0, 0]
    records = read(output)
    runs = intervals(records)[""]
    assert ended_ids(records) == ids  # every job ran
    assert len({pid for _, _, pid in runs}) >= 2  # more than one process did
    assert overlaps(runs) == 0


async def test_a_sigkilled_holder_gives_its_permit_back_and_every_job_runs(
    tmp_path: Path,
) -> None:
    output = tmp_path / "runs.jsonl"
    async with sepp_server(BASE) as server:
        ids = await enqueue_work(server, [{} for _ in range(12)])
        spec = {"name": "killed", "concurrency": 1, "hold": 1.0, "lease": 2.0, "idle": 12.0}
        processes = start_processes(server, spec, 2, output)
        by_pid = {p.pid: p for p in processes}

        def someone_is_running(records: list[dict[str, Any]]) -> bool:
            open_runs = {(r["pid"], r["id"]) for r in records if r["event"] == "start"} - {
                (r["pid"], r["id"]) for r in records if r["event"] == "end"
            }
            return len(ended_ids(records)) >= 2 and bool(open_runs)

        records = await wait_for(someone_is_running, output)
        started = {(r["pid"], r["id"]) for r in records if r["event"] == "start"}
        running = started - {(r["pid"], r["id"]) for r in records if r["event"] == "end"}
        (victim, _), *_ = running
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        survivors = [p for pid, p in by_pid.items() if pid != victim]
        assert await finish(survivors) == [0]
        await finish([by_pid[victim]])
    records = read(output)
    assert ended_ids(records) == ids  # the killed one's job too, run by the survivor
    runs = intervals(records, {victim: killed_at})[""]
    assert overlaps(runs) == 0
    after = [start for start, _, pid in runs if pid != victim and start >= killed_at]
    assert after  # the survivor went on after the kill (within a lease: docs/limits.md)


async def test_processes_run_two_tenants_in_parallel_and_never_one_twice(
    tmp_path: Path,
) -> None:
    output = tmp_path / "runs.jsonl"
    async with sepp_server(BASE) as server:
        ids = await enqueue_work(server, [{"tenant": t} for t in "ab" * 10])
        spec = {"name": "tenant", "concurrency": 1, "key": "tenant", "hold": 0.2, "lease": 3.0}
        processes = start_processes(server, spec, 2, output)
        assert await finish(processes) == [0, 0]
    records = read(output)
    assert ended_ids(records) == ids
    per_key = intervals(records)
    assert overlaps(per_key["a"]) == 0 and overlaps(per_key["b"]) == 0
    assert overlaps(per_key["a"] + per_key["b"]) > 0  # the tenants did not wait for each other


async def test_processes_sharing_a_global_rate_stay_within_it(tmp_path: Path) -> None:
    output = tmp_path / "runs.jsonl"
    async with sepp_server(BASE) as server:
        ids = await enqueue_work(server, [{} for _ in range(24)])
        spec = {"name": "rated", "rate": 4, "per": 1.0, "hold": 0.0, "idle": 4.0}
        processes = start_processes(server, spec, 3, output)
        assert await finish(processes) == [0, 0, 0]
    records = read(output)
    assert ended_ids(records) == ids
    starts = sorted(r["t"] for r in records if r["event"] == "start")
    # At most 4 grants per second on the server's clock; starts follow grants by the time an
    # answer takes to reach a process, so the windows are taken a little shorter.
    window = 1.0 - 0.25
    assert max(sum(1 for s in starts if t <= s < t + window) for t in starts) <= 4
    assert starts[-1] - starts[0] >= 5 * 0.99  # 24 starts at 4 a second: 5 full windows
