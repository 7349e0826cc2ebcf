"""`sepp-trio enqueue --task` and `enqueue-file --task` against the real server: JSON is checked
against the task's payload type before anything is sent."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from test_cli_real import assert_one_line_failure, cli, reserve_all

import sepp
from sepp.testing import SeppServer

TASKS = textwrap.dedent(
    """
    import dataclasses
    import sepp

    @dataclasses.dataclass
    class Welcome:
        user: int
        name: str = "friend"

    send_welcome = sepp.Task("emails", "send_welcome", Welcome, priority=5, max_attempts=3)
    not_a_task = 42
    """
)


def write_tasks(tmp_path: Path) -> Path:
    (tmp_path / "shop_tasks.py").write_text(TASKS)
    return tmp_path


async def test_enqueue_task_checks_the_json_then_sends_the_tasks_job(
    sepp_server: SeppServer, client: sepp.Client, tmp_path: Path
) -> None:
    cwd = write_tasks(tmp_path)
    task = ("enqueue", "--task", "shop_tasks:send_welcome")
    bad = await cli(sepp_server.address, *task, "--json", '{"user": "42"}', cwd=cwd)
    assert_one_line_failure(
        bad,
        2,
        "--json does not fit task 'send_welcome'",
        "payload does not decode into Welcome: $.user: expected integer, got string",
    )
    missing = await cli(sepp_server.address, *task, "--json", '{"name": "x"}', cwd=cwd)
    assert_one_line_failure(missing, 2, "$: missing required field 'user'")
    wrong = await cli(sepp_server.address, "enqueue", "--task", "shop_tasks:not_a_task", cwd=cwd)
    assert_one_line_failure(wrong, 2, "shop_tasks:not_a_task is a int, not a sepp.Task")
    both = await cli(sepp_server.address, "enqueue", "q", "t", *task[1:], cwd=cwd)
    assert_one_line_failure(both, 2, "omit QUEUE and JOB_TYPE")
    neither = await cli(sepp_server.address, "enqueue", "--json", "{}", cwd=cwd)
    assert_one_line_failure(
        neither, 2, "the following arguments are required: QUEUE, JOB_TYPE (or --task MODULE:ATTR)"
    )

    done = await cli(
        sepp_server.address, *task, "--json", '{"user": 42}', "--priority", "7", cwd=cwd
    )
    assert done.returncode == 0 and done.stderr == "", done
    (job,) = await reserve_all(client, "emails", 1)
    assert job.id == done.stdout.strip()
    assert job.ctx.job_type == "send_welcome"
    assert (job.ctx.priority, job.ctx.max_attempts) == (7, 3)  # the call's, then the task's
    assert job.payload is not None
    assert json.loads(job.payload.data) == {"user": 42, "name": "friend"}


async def test_enqueue_file_task_reports_lines_that_do_not_fit_by_number(
    sepp_server: SeppServer, client: sepp.Client, tmp_path: Path
) -> None:
    cwd = write_tasks(tmp_path)
    lines = [
        '{"json": {"user": 1}}',  # 1 ok
        '{"json": {"user": "two"}}',  # 2 the wrong type
        '{"json": {}}',  # 3 a missing field
        '{"job_type": "other", "json": {"user": 4}}',  # 4 another task's type
        '{"json": {"user": 5}, "priority": 9, "queue": "vip"}',  # 5 ok, overrides
    ]
    (tmp_path / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    done = await cli(
        sepp_server.address,
        "enqueue-file",
        "jobs.jsonl",
        "--task",
        "shop_tasks:send_welcome",
        cwd=cwd,
    )
    assert done.returncode == 1, done
    assert done.stdout.splitlines() == ["2 enqueued, 0 deduplicated, 0 rejected, 3 invalid"]
    warning, *others = done.stderr.splitlines()
    assert warning.startswith("line 1: warning: no idempotency_key")
    reports = sorted(others)
    assert reports == [
        "line 2: invalid: 'json' does not fit task 'send_welcome': payload does not decode into"
        " Welcome: $.user: expected integer, got string",
        "line 3: invalid: 'json' does not fit task 'send_welcome': payload does not decode into"
        " Welcome: $: missing required field 'user'",
        "line 4: invalid: job_type 'other' is not the task's 'send_welcome'",
    ]
    (plain,) = await reserve_all(client, "emails", 1)
    (vip,) = await reserve_all(client, "vip", 1)
    assert (plain.ctx.priority, vip.ctx.priority) == (5, 9)
    assert vip.payload is not None and json.loads(vip.payload.data) == {"user": 5, "name": "friend"}
