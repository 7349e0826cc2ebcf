"""Chaos against the real sepp server: the short version that runs with every test run.

2,000 keyed jobs through 4 worker processes while the server is SIGKILLed and restarted
twice; a worker SIGKILLed mid-handler; a worker SIGTERMed under load. The scenarios live in
harness.py; the long version (20,000 jobs, 5 restarts) is `make chaos`, its figures are in
RESULTS.md. Each test prints a `[chaos figures]` line (run with `-s`) and names its seed;
`CHAOS_SEED=N` replays the same random choices.
"""

from __future__ import annotations

import os
from pathlib import Path

import harness

SEED = int(os.environ.get("CHAOS_SEED") or harness.new_seed())


def _passed(report: harness.Report) -> None:
    print("\n" + report.summary())
    assert not report.problems, report.summary()


async def test_no_acked_job_is_lost_when_the_server_crashes_twice(tmp_path: Path) -> None:
    params = harness.ChaosParams(jobs=2000, restarts=2, workers=4, seed=SEED, timeout_s=240)
    report = await harness.run_chaos(params, tmp_path)
    restarts = report.details.get("restarts", [])
    assert isinstance(restarts, list)
    print("\n  restarts: " + harness.describe_restarts(restarts, params.jobs))
    _passed(report)
    assert report.figures["lost"] == 0
    assert report.figures["restarts"] == 2
    assert report.figures["processed"] == report.figures["enqueue_acked"] == 2000


async def test_a_killed_workers_jobs_come_back_after_the_lease(tmp_path: Path) -> None:
    report = await harness.run_worker_kill(tmp_path, SEED)
    _passed(report)
    assert report.figures["rescued"] == 4


async def test_sigterm_under_load_finishes_in_flight_jobs_and_redelivers_none(
    tmp_path: Path,
) -> None:
    report = await harness.run_worker_sigterm(tmp_path, SEED, jobs=400)
    _passed(report)
    assert report.figures["redeliveries"] == 0
    assert report.figures["exit_status"] == 0
