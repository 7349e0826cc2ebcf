"""The long chaos run, on demand: `make chaos`, or

    PYTHONPATH=src:tests .venv/bin/python tests/chaos/run_long.py [--jobs 20000] [--restarts 5]
        [--seed N] [--results tests/chaos/RESULTS.md] [--keep]

Runs the three chaos scenarios (see harness.py) at full size, prints their figures, and with
`--results` writes them as Markdown. Exits 1 if any promise was broken. The seed is printed
first: rerun with `--seed` to draw the same restart moments (timing still varies).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import harness
import trio

import sepp
from sepp.testing import SEPP_SERVER_VERSION


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="sepp-trio long chaos run")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--restarts", type=int, default=5)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--results", type=Path, default=None, help="write figures here (Markdown)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (records, logs, data)")
    return p.parse_args(argv)


def results_markdown(
    args: argparse.Namespace, chaos: harness.Report, kill: harness.Report, term: harness.Report
) -> str:
    f = chaos.figures
    d = chaos.details
    restarts = d.get("restarts", [])
    assert isinstance(restarts, list)
    ok = not (chaos.problems or kill.problems or term.problems)
    p = harness.ChaosParams(seed=chaos.seed)
    rows = [
        ("jobs (uniquely keyed)", f["jobs"]),
        ("server SIGKILL + restart", f["restarts"]),
        ("worker processes", args.workers),
        ("**lost** (acked enqueue never processed)", f"**{f['lost']}**"),
        ("duplicates (jobs processed more than once)", f["duplicates"]),
        ("extra handler runs", f["extra_runs"]),
        ("acked jobs that came back (must be 0)", f["acked_then_redelivered"]),
        ("enqueue keys acked / never acked", f"{f['enqueue_acked']} / {f['enqueue_failed_keys']}"),
        ("failed enqueue attempts, per key (each retried with the same key)", f["failed_attempts"]),
        ("acks that were dedup hits (a failed try had committed)", f["dedup_acks"]),
        ("redelivered reserves (attempt > 1)", f["redelivered"]),
        ("… of which the crash swallowed the reserve reply", f["reserve_replies_lost"]),
        ("failed acks (after the client's retries)", f["ack_failures"]),
        ("lease extends / failed", f"{f['extends']} / {f['extend_failures']}"),
        ("leases lost (worker ERROR logs, acceptable)", f["lease_lost"]),
        ("slowest worker to reserve again after a restart", f"{f['max_resume_s']} s"),
        ("tracebacks in any worker's stderr", f["tracebacks"]),
        ("dead letters", f["dead_letters"]),
        ("duration (enqueue + process)", f"{f['duration_s']} s"),
        ("graceful SIGTERM of all workers", f"{f['shutdown_s']} s, all exit 0"),
        ("seed", chaos.seed),
    ]
    lines = [
        "# Chaos run results",
        "",
        "Figures of one long run of `make chaos` (tests/chaos/run_long.py), produced by the run"
        " itself.",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}; sepp-trio {sepp.__version__};"
        f" sepp server {SEPP_SERVER_VERSION}; Python {platform.python_version()};"
        f" {platform.system()} {platform.machine()}",
        f"- Command: `{' '.join(['run_long.py', *sys.argv[1:]])}` (seed {chaos.seed})",
        f"- Verdict: {'PASS — every promise held' if ok else 'FAIL'}",
        "",
        "## Server crashes under load",
        "",
        "Producers enqueue every job with an idempotency key, four ways (`enqueue`,"
        " `enqueue_batch`, `enqueue_atomic`, auto-batched `enqueue`), retrying failures with"
        f" the same key; {args.workers} worker processes (`sepp.Worker`, {p.max_in_flight} in"
        f" flight, {p.lease:g} s lease, handlers {p.sleep_ms.replace(':', '-')} ms and"
        f" {p.slow_fraction:.0%} of them {p.slow_ms.replace(':', '-')} ms) record each job"
        " durably (fsync) before the handler returns;"
        ' the server (`persist_mode = "sync_data"`) is SIGKILLed at seeded random moments,'
        f" stays down {p.down_s[0]:g}-{p.down_s[1]:g} s, and restarts on the same data"
        " directory.",
        "",
        "| figure | value |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in rows),
        "",
        "Restarts: " + harness.describe_restarts(restarts, int(f["jobs"])),  # type: ignore[call-overload]
        "",
        f"Enqueue errors seen by producers: {d.get('enqueue_errors')}. Acks by mode:"
        f" {d.get('by_mode')}. Failed acks by error: {d.get('ack_failures')}; duplicates by what"
        f" became of the first run's ack: {d.get('duplicate_causes')}. Jobs each worker"
        f" did after the last restart: {d.get('after_last_restart')} (+ probe jobs"
        f" {d.get('probes_by_worker')}).",
        "",
        "Reading the figures: sepp is at-least-once. A duplicate is a job whose first run"
        " finished but whose ack did not stick: the outage outlasted the client's ack retries"
        " (ConnectError), or the lease ran out meanwhile and the server had requeued the job"
        " (JobNotFoundError / AttemptMismatchError); the worker logs each at WARNING and the job"
        " runs again. A redelivery without a duplicate is a lost lease (the handler was"
        " cancelled) or a reserve whose reply the crash swallowed. Lost must be 0: every"
        " enqueue the client acked was processed. Failed enqueues were reported as errors,"
        " never as acks; retried with the same key, each key ended with exactly one job.",
        "",
        "## A worker SIGKILLed mid-handler",
        "",
        _figure_list(kill),
        "",
        "## SIGTERM of a worker under load",
        "",
        _figure_list(term),
        "",
    ]
    for report in (chaos, kill, term):
        for problem in report.problems:
            lines.append(f"- PROBLEM ({report.name}): {problem}")
    return "\n".join(lines) + "\n"


def _figure_list(report: harness.Report) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in report.figures.items())


async def main(args: argparse.Namespace, workdir: Path) -> list[harness.Report]:
    seed = args.seed if args.seed is not None else harness.new_seed()
    print(f"chaos: seed={seed} jobs={args.jobs} restarts={args.restarts} workdir={workdir}")
    params = harness.ChaosParams(
        jobs=args.jobs,
        restarts=args.restarts,
        workers=args.workers,
        seed=seed,
        timeout_s=max(300.0, args.jobs / 20),
    )
    reports = []
    for name, run in (
        ("chaos", lambda: harness.run_chaos(params, workdir / "chaos")),
        ("kill", lambda: harness.run_worker_kill(workdir / "kill", seed)),
        ("sigterm", lambda: harness.run_worker_sigterm(workdir / "sigterm", seed, jobs=1000)),
    ):
        began = time.monotonic()
        report = await run()
        print(report.summary())
        if name == "chaos":
            print("  restarts: " + harness.describe_restarts(report.details["restarts"], args.jobs))  # type: ignore[arg-type]
            for key, value in report.details.items():
                if key != "restarts":
                    print(f"  {key}: {value}")
        print(f"  ({time.monotonic() - began:.1f}s)")
        reports.append(report)
    return reports


if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    workdir = Path(tempfile.mkdtemp(prefix="sepp-chaos-"))
    reports = trio.run(main, args, workdir)
    failed = any(r.problems for r in reports)
    if args.keep or failed:
        print(f"records, logs and data kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.results is not None:
        args.results.write_text(results_markdown(args, *reports), encoding="utf-8")
        print(f"figures written to {args.results}")
    sys.exit(1 if failed else 0)
