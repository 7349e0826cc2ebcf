"""The `sepp-trio` command line, run as a subprocess against the real sepp server.

Each test runs `python -m sepp` (the same entry point as the `sepp-trio` console script, which
one test runs too) and checks exit statuses, stdout and stderr, then looks at the server
through the client to see what the command really did.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import trio

import sepp
from sepp._cli import _dead_letters
from sepp._cli._parser import build_parser
from sepp.testing import SeppServer, sepp_server

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).with_name("sepp-trio")
TIMEOUT_S = 60
UNUSED_ADDRESS = "127.0.0.1:1"  # for commands refused before they connect


def config(**sections: Mapping[str, object]) -> dict[str, object]:
    base: dict[str, object] = {
        "admin": {"enabled": False},
        "storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 600_000},
    }
    base.update(sections)
    return base


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("SEPP_ADDR", "SEPP_API_KEY", "PYTHONPATH")
    }
    env["PYTHONPATH"] = str(ROOT / "src")
    env.update(extra or {})
    return env


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str

    @property
    def stdout_lines(self) -> list[str]:
        return self.stdout.splitlines()


async def cli(
    address: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: bytes = b"",
    cwd: Path | None = None,
    program: Sequence[str] = (sys.executable, "-m", "sepp"),
) -> Done:
    with trio.fail_after(TIMEOUT_S):
        done = await trio.run_process(
            [*program, "--address", address, *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=cli_env(env),
            cwd=cwd,
        )
    return Done(done.returncode, done.stdout.decode(), done.stderr.decode())


def assert_one_line_failure(done: Done, status: int, *fragments: str) -> None:
    assert done.returncode == status, done
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr


class Running:
    """A CLI process whose stdout and stderr are collected as they arrive."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self._changed = trio.Event()

    async def collect(self, name: str, stream: trio.abc.ReceiveStream) -> None:
        async for chunk in stream:
            self.out[name] += chunk
            self._changed.set()
            self._changed = trio.Event()

    def text(self, name: str) -> str:
        return self.out[name].decode()

    async def wait_for(self, fragment: str, name: str = "stderr", count: int = 1) -> None:
        with trio.fail_after(TIMEOUT_S):
            while self.text(name).count(fragment) < count:
                if self.process.returncode is not None:
                    raise AssertionError(f"exited before printing {fragment!r}: {self.out}")
                await self._changed.wait()

    def send(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def wait(self, timeout_s: float = TIMEOUT_S) -> int:
        with trio.fail_after(timeout_s):
            return await self.process.wait()


@asynccontextmanager
async def spawn(
    address: str, *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> AsyncIterator[Running]:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "sepp", "--address", address, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(env),
        cwd=cwd,
    )
    running = Running(process)
    try:
        async with trio.open_nursery() as nursery:
            assert process.stdout is not None and process.stderr is not None
            nursery.start_soon(running.collect, "stdout", process.stdout)
            nursery.start_soon(running.collect, "stderr", process.stderr)
            yield running
            await running.wait()
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()


async def make_dead_letters(client: sepp.Client, queue: str, count: int) -> list[str]:
    """Enqueue `count` jobs with varied payloads, send each straight to the dead letters, and
    return their ids in the order they were dead-lettered (the order drain returns them)."""
    payloads = [
        sepp.Payload.json({"invoice": 1}),
        sepp.Payload.text("naïve text"),
        sepp.Payload.bytes(b"\x00\xffraw", "application/x-raw"),
    ]
    for n in range(count):
        await client.enqueue(
            queue,
            "charge",
            payload=payloads[n % 3],
            priority=n % 10,
            custom={"n": n, "ratio": 0.5, "ok": True, "tenant": "acme"},
        )
    dead: list[str] = []
    while len(dead) < count:
        jobs = await client.reserve(queue, lease_duration=30, wait_timeout=5, max_jobs=1)
        for job in jobs or ():
            await client.nack(job.ctx, reason=f"declined {job.id}", retry=sepp.Retry.DEAD_LETTER)
            dead.append(job.id)
            # The server orders dead letters by their millisecond timestamp: keep them apart,
            # so "oldest first" has one answer.
            await trio.sleep(0.002)
    return dead


async def reserve_all(client: sepp.Client, queue: str, count: int) -> list[sepp.Job]:
    jobs: list[sepp.Job] = []
    with trio.fail_after(TIMEOUT_S):
        while len(jobs) < count:
            got = await client.reserve(queue, lease_duration=60, wait_timeout=5, max_jobs=count)
            jobs += got or []
    return jobs


# -- the entry points, info, usage --------------------------------------------------------------


async def test_console_script_and_python_m_run_the_same_command(sepp_server: SeppServer) -> None:
    assert CONSOLE_SCRIPT.exists(), "the sepp-trio console script is not installed in the venv"
    script = await cli(sepp_server.address, "info", "--json", program=[str(CONSOLE_SCRIPT)])
    module = await cli(sepp_server.address, "info", "--json")
    assert script.returncode == module.returncode == 0, (script, module)
    for done in (script, module):
        info = json.loads(done.stdout)
        assert info["server_version"] == "0.1.1" and info["max_enqueue_batch"] == 256
    version = await cli(sepp_server.address, "--version", program=[str(CONSOLE_SCRIPT)])
    assert version.stdout.strip() == f"sepp-trio {sepp.__version__}"


async def test_info_prints_every_limit(sepp_server: SeppServer, client: sepp.Client) -> None:
    server = await client.get_server_info()
    done = await cli(sepp_server.address, "info")
    assert done.returncode == 0 and done.stderr == ""
    rows = dict(line.split(None, 1) for line in done.stdout_lines)
    assert rows["server_version"] == server.server_version
    assert rows["max_payload_bytes"] == str(server.max_payload_bytes)
    assert rows["max_lease_duration_s"] == "300"
    assert rows["dead_letter_retention_enabled"] == "yes"
    assert len(rows) == 20

    as_json = json.loads((await cli(sepp_server.address, "info", "--json")).stdout)
    assert as_json["max_schedule_horizon_s"] == server.max_schedule_horizon.total_seconds()
    assert as_json["supported_protocol_versions"] == ["v1"]
    assert as_json["strict_queues"] is False


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["enqueue", "q"], "the following arguments are required: JOB_TYPE"),
        (["enqueue", "q", "t", "--priority", "12"], "priority: must be between 0 and 9, got 12"),
        (["enqueue", "q", "t", "--json", "{oops"], "--json: not valid JSON"),
        (["enqueue", "q", "t", "--json", "NaN"], "NaN is not JSON"),
        (["enqueue", "q", "t", "--json", '{"x": Infinity}'], "Infinity is not JSON"),
        (["enqueue", "q", "t", "--at", "2030-01-01T09:00"], "has no UTC offset"),
        (["enqueue", "q", "t", "--delay", "-1"], "non-negative number of seconds"),
        (["enqueue", "q", "t", "--custom", "novalue"], "expected KEY=VALUE"),
        (["enqueue", "q", "t", "--custom", "k=1", "--custom-str", "k=1"], "'k' is given twice"),
        (["enqueue", "q", "t", "--encoding", "x/y"], "--encoding labels --data-file"),
        (["enqueue", "q", "t", "--json", "1", "--text", "x"], "not allowed with argument"),
        (["enqueue", "q", "t", "--pri", "1"], "unrecognized arguments: --pri"),
        (["dead-letters", "replay", "--from", "f", "--max", "1"], "--from replays a saved file"),
        (["worker", "app:router"], "the following arguments are required: --queue"),
        (["worker", "no_such_module_xyz:router", "--queue", "q"], "no module named"),
        (["worker", "os:sep", "--queue", "q"], "os:sep is a str, not a sepp.Router"),
        (
            ["worker", "time:time", "--queue", "q"],
            "time:time() returned a float, not a sepp.Router",
        ),
        (["worker", "json", "--queue", "q"], "expected MODULE:ATTR"),
        (["worker", "json:nothing_here", "--queue", "q"], "has no attribute 'nothing_here'"),
        (["scheduler", "os:sep"], "os:sep is a str, not a sepp.Schedule"),
        (["scheduler", "sepp:Schedule"], "sepp:Schedule has no entries"),
        (["scheduler", "sepp:Schedule", "--missed", "never"], "invalid choice: 'never'"),
        (["scheduler", "sepp:Schedule", "--lookahead", "0"], "must be more than 0 seconds"),
    ],
)
@pytest.mark.unit  # refused before any connection: no server needed
async def test_usage_errors_exit_2_with_one_clear_message(args: list[str], fragment: str) -> None:
    done = await cli(UNUSED_ADDRESS, *args)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert fragment in done.stderr.splitlines()[-1], done.stderr


async def test_an_unreachable_server_is_one_line_and_exit_1_and_debug_adds_the_traceback(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    await sepp_server.stop()
    replay = await cli(sepp_server.address, "dead-letters", "replay", cwd=tmp_path)
    assert_one_line_failure(replay, 1, "sepp-trio dead-letters replay: cannot connect to")
    assert saved_files(tmp_path) == []  # nothing drained: no file left behind
    done = await cli(sepp_server.address, "--connect-timeout", "2", "info")
    assert_one_line_failure(done, 1, f"sepp-trio info: cannot connect to {sepp_server.address}")
    debug = await cli(sepp_server.address, "--debug", "info")
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "ConnectError" in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith("sepp-trio info: cannot connect to")


# -- enqueue ----------------------------------------------------------------------------------


@pytest.mark.arch_smoke  # the command line's round trip: enqueue, drain, worker
async def test_enqueue_prints_the_job_id_and_sends_every_option(
    sepp_server: SeppServer, client: sepp.Client
) -> None:
    at = datetime.now(timezone.utc) - timedelta(seconds=5)  # in the past: ready at once
    done = await cli(
        sepp_server.address,
        "enqueue",
        "emails",
        "send_welcome",
        "--json",
        '{"user": 42, "tags": ["a"]}',
        "--priority",
        "7",
        "--max-attempts",
        "4",
        "--idempotency-key",
        "welcome-42",
        "--at",
        at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )
    assert done.returncode == 0 and done.stderr == "", done
    (job_id,) = done.stdout_lines
    (job,) = await client.reserve("emails", lease_duration=30, wait_timeout=5) or []
    assert job.id == job_id
    assert job.payload == sepp.Payload.json({"user": 42, "tags": ["a"]})
    assert (job.ctx.job_type, job.ctx.priority, job.ctx.max_attempts) == ("send_welcome", 7, 4)
    assert job.ctx.scheduled_at is not None
    assert abs((job.ctx.scheduled_at - at).total_seconds()) < 0.002

    again = await cli(
        sepp_server.address, "enqueue", "emails", "other", "--idempotency-key", "welcome-42"
    )
    assert again.returncode == 0 and again.stdout_lines == [job_id]
    assert "deduplicated" in again.stderr


async def test_custom_values_are_typed_int_float_bool_else_str(
    sepp_server: SeppServer, client: sepp.Client
) -> None:
    done = await cli(
        sepp_server.address,
        "enqueue",
        "q",
        "t",
        *("--custom", "n=5", "--custom", "neg=-3", "--custom", "f=5.0"),
        *("--custom", "e=1e3", "--custom", "yes=true", "--custom", "no=false"),
        *("--custom", "word=hello", "--custom", "mixed=5a", "--custom", "eq=a=b"),
        *("--custom", "True=True", "--custom", "empty="),
        *("--custom-str", "forced=5", "--custom-str", "flag=true"),
    )
    assert done.returncode == 0, done
    (job,) = await client.reserve("q", lease_duration=30, wait_timeout=5) or []
    typed = {key: (type(value).__name__, value) for key, value in job.ctx.custom.items()}
    assert typed == {
        "n": ("int", 5),
        "neg": ("int", -3),
        "f": ("float", 5.0),
        "e": ("float", 1000.0),
        "yes": ("bool", True),
        "no": ("bool", False),
        "word": ("str", "hello"),
        "mixed": ("str", "5a"),
        "eq": ("str", "a=b"),
        "True": ("str", "True"),
        "empty": ("str", ""),
        "forced": ("str", "5"),
        "flag": ("str", "true"),
    }


async def test_enqueue_text_and_data_file_payloads(
    sepp_server: SeppServer, client: sepp.Client, tmp_path: Path
) -> None:
    data = tmp_path / "blob.bin"
    data.write_bytes(b"\x00\x01binary\xff")
    runs = [
        (["--text", "héllo"], b"", sepp.Payload.text("héllo")),
        (["--data-file", str(data)], b"", sepp.Payload.bytes(b"\x00\x01binary\xff")),
        (
            ["--data-file", "-", "--encoding", "image/png"],
            b"PNG!",
            sepp.Payload(b"PNG!", "image/png"),
        ),
        ([], b"", None),
    ]
    for args, stdin, expected in runs:
        done = await cli(sepp_server.address, "enqueue", "files", "t", *args, stdin=stdin)
        assert done.returncode == 0, done
        (job,) = await client.reserve("files", lease_duration=30, wait_timeout=5) or []
        assert job.id == done.stdout.strip()
        assert job.payload == expected


async def test_a_rejected_job_exits_1_with_the_reason() -> None:
    strict = config(server={"strict_queues": True}, queues=[{"name": "known"}])
    async with sepp_server(strict) as server:
        done = await cli(server.address, "enqueue", "unknown", "t")
        assert_one_line_failure(done, 1, "sepp-trio enqueue: job rejected: unknown queue 'unknown'")
        assert done.stdout == ""
        ok = await cli(server.address, "enqueue", "known", "t")
        assert ok.returncode == 0 and len(ok.stdout.strip()) == 36


# -- enqueue-file -----------------------------------------------------------------------------


def job_lines(count: int) -> str:
    return "".join(
        json.dumps(
            {
                "queue": "bulk",
                "job_type": "import",
                "json": {"row": n},
                "idempotency_key": f"row-{n}",
                "custom": {"row": n, "half": n / 2, "even": n % 2 == 0},
                "priority": n % 10,
            }
        )
        + "\n"
        for n in range(count)
    )


async def test_enqueue_file_sends_chunks_within_the_server_batch_limit_and_dedups_a_rerun(
    tmp_path: Path,
) -> None:
    # A server batch limit below the client's fallback: a chunk over it would fail the call.
    async with sepp_server(config(limits={"max_enqueue_batch": 64})) as server:
        path = tmp_path / "jobs.jsonl"
        path.write_text(job_lines(1000))
        first = await cli(server.address, "enqueue-file", str(path))
        assert first.returncode == 0, first
        assert first.stdout_lines == ["1000 enqueued, 0 deduplicated, 0 rejected, 0 invalid"]
        assert first.stderr == ""  # not a terminal: no progress
        again = await cli(server.address, "enqueue-file", "-", stdin=path.read_bytes())
        assert again.returncode == 0, again
        assert again.stdout_lines == ["0 enqueued, 1000 deduplicated, 0 rejected, 0 invalid"]

        async with sepp.open(server.address) as client:
            jobs = await reserve_all(client, "bulk", 1000)
            assert len(jobs) == 1000
            assert await client.reserve("bulk", lease_duration=1, wait_timeout=0) is None
        rows = sorted(job.payload.json()["row"] for job in jobs if job.payload)
        assert rows == list(range(1000))
        sample = next(job for job in jobs if job.ctx.custom["row"] == 7)
        assert sample.ctx.custom == {"row": 7, "half": 3.5, "even": False}
        assert sample.ctx.priority == 7


async def test_enqueue_file_reports_invalid_and_rejected_lines_by_number(tmp_path: Path) -> None:
    strict = config(server={"strict_queues": True}, queues=[{"name": "known"}])
    lines = [
        '{"queue": "known", "job_type": "a", "text": "one"}',  # 1 ok
        "not json",  # 2 invalid
        "",  # 3 blank: skipped
        '{"queue": "known"}',  # 4 invalid
        '{"queue": "nowhere", "job_type": "b"}',  # 5 rejected by the server
        '{"queue": "known", "job_type": "c", "priority": 12}',  # 6 invalid
        '{"queue": "known", "job_type": "d", "colour": "red"}',  # 7 invalid
        '{"queue": "known", "job_type": "e", "scheduled_at": "2030-01-01T00:00:00"}',  # 8 invalid
        '{"queue": "known", "job_type": "f", "json": [1, 2]}',  # 9 ok
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    async with sepp_server(strict) as server:
        done = await cli(server.address, "enqueue-file", str(path))
        assert done.returncode == 1
        assert done.stdout_lines == ["2 enqueued, 0 deduplicated, 1 rejected, 5 invalid"]
        warning, *others = done.stderr.splitlines()
        assert warning.startswith("line 1: warning: no idempotency_key: a rerun")
        reports = sorted(others)
        assert [line.split(": ")[0:2] for line in reports] == [
            ["line 2", "invalid"],
            ["line 4", "invalid"],
            ["line 5", "rejected"],
            ["line 6", "invalid"],
            ["line 7", "invalid"],
            ["line 8", "invalid"],
        ]
        assert "unknown queue 'nowhere'" in reports[2]
        assert "'job_type' is required" in reports[1]
        assert "unknown key(s) 'colour'" in reports[4]
        async with sepp.open(server.address) as client:
            jobs = await reserve_all(client, "known", 2)
        assert sorted(job.ctx.job_type for job in jobs) == ["a", "f"]


async def test_enqueue_file_streams_stdin_and_says_what_was_sent_when_the_server_dies(
    tmp_path: Path,
) -> None:
    lines = job_lines(200).splitlines(keepends=True)
    async with sepp_server(config()) as server:
        async with spawn(server.address, "enqueue-file", "-") as running:
            assert running.process.stdin is not None
            await running.process.stdin.send_all("".join(lines[:100]).encode())
            async with sepp.open(server.address) as client:
                assert len(await reserve_all(client, "bulk", 100)) == 100  # sent as they came
            await server.stop(kill=True)
            await running.process.stdin.send_all("".join(lines[100:]).encode())
            await running.process.stdin.aclose()
            status = await running.wait()
    assert status == 1
    assert running.text("stdout") == "100 enqueued, 0 deduplicated, 0 rejected, 0 invalid\n"
    (message,) = running.text("stderr").splitlines()
    # The second write may reach the command in more than one read, hence `last`.
    found = re.fullmatch(
        r"sepp-trio enqueue-file: sending lines 101-(\d+) failed: .+\. Lines before 101 were"
        r" handled as counted on stdout; lines 101-(\d+) may or may not have been enqueued;"
        r" nothing after line (\d+) was sent; resume with --start-at 101",
        message,
    )
    assert found is not None, message
    assert len(set(found.groups())) == 1 and 101 < int(found[1]) <= 200


def keyless_lines(count: int) -> list[str]:
    return [
        json.dumps({"queue": "bulk", "job_type": "import", "json": {"row": n}}) + "\n"
        for n in range(count)
    ]


async def test_enqueue_file_interrupted_says_where_to_resume_and_start_at_resumes_exactly(
    tmp_path: Path,
) -> None:
    # Lines without keys: a rerun from the start would double them, so only the reported line
    # makes the second run exact. The first keyless line is warned about before it is sent.
    # Line 121 is invalid and sent once lines 1-120 reached the server: it is read, and
    # reported, only after their chunk was confirmed. Ctrl-C then comes while the command waits
    # on the open pipe, the case that used to hang in close().
    lines = [*keyless_lines(120), "not json\n", *keyless_lines(300)[120:]]
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(lines))
    async with sepp_server(config()) as server:
        async with sepp.open(server.address) as client:
            async with spawn(server.address, "enqueue-file", "-") as running:
                assert running.process.stdin is not None
                await running.process.stdin.send_all("".join(lines[:120]).encode())
                first = await reserve_all(client, "bulk", 120)  # sent, maybe not yet confirmed
                await running.process.stdin.send_all(lines[120].encode())
                await running.wait_for("line 121: invalid: not JSON")  # read once confirmed
                running.send(signal.SIGINT)
                status = await running.wait()
            stderr = running.text("stderr")
            assert status == 130, running.out
            assert running.text("stdout") == "120 enqueued, 0 deduplicated, 0 rejected, 1 invalid\n"
            assert stderr.count("warning: no idempotency_key") == 1
            assert (
                "interrupted before line 122 was confirmed (every line before it was handled):"
                " resume with --start-at 122" in stderr
            ), stderr
            assert stderr.rstrip().endswith("sepp-trio enqueue-file: interrupted")

            resumed = await cli(server.address, "enqueue-file", str(path), "--start-at", "122")
            assert resumed.returncode == 0, resumed
            assert resumed.stdout_lines == ["180 enqueued, 0 deduplicated, 0 rejected, 0 invalid"]
            rest = await reserve_all(client, "bulk", 180)
            assert await client.reserve("bulk", lease_duration=1, wait_timeout=0) is None
    rows = sorted(job.payload.json()["row"] for job in first + rest if job.payload)
    assert rows == list(range(300))  # each line once: none lost, none doubled


async def test_enqueue_file_start_at_must_be_a_line_number() -> None:
    done = await cli(UNUSED_ADDRESS, "enqueue-file", "-", "--start-at", "0")
    assert done.returncode == 2
    assert "expected a line number (1 or more), got '0'" in done.stderr


async def test_enqueue_file_shows_progress_only_on_a_terminal(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    import pty

    path = tmp_path / "jobs.jsonl"
    path.write_text(job_lines(600))
    command = ["enqueue-file", str(path)]
    leader, follower = pty.openpty()
    try:
        with trio.fail_after(TIMEOUT_S):
            done = await trio.run_process(
                [sys.executable, "-m", "sepp", "--address", sepp_server.address, *command],
                capture_stdout=True,
                stderr=follower,
                env=cli_env(),
            )
        os.close(follower)
        follower = -1
        shown = bytearray()
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal has no writer left
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert done.stdout.decode().splitlines() == [
        "600 enqueued, 0 deduplicated, 0 rejected, 0 invalid"
    ]
    assert b"\r" in shown and b"lines read: 256 enqueued" in shown


# -- dead letters -----------------------------------------------------------------------------


@pytest.mark.arch_smoke  # (the round trip)
async def test_drain_prints_json_lines_and_out_appends_to_a_file(
    sepp_server: SeppServer, client: sepp.Client, tmp_path: Path
) -> None:
    ids = await make_dead_letters(client, "billing", 5)
    done = await cli(
        sepp_server.address, "dead-letters", "drain", "--queue", "billing", "--max", "2"
    )
    assert done.returncode == 0, done
    first = [json.loads(line) for line in done.stdout_lines]
    assert [record["job"]["id"] for record in first] == ids[:2]
    # Higher priorities were reserved, so dead-lettered, first: n=4 (text), then n=3 (JSON).
    text_record, json_record = first
    assert json_record["cause"] == "rejected" and json_record["final_attempt"] == 1
    assert json_record["last_reason"] == f"declined {ids[1]}"
    assert json_record["failed_at"].endswith("+00:00")
    assert json_record["job"]["payload"] == {
        "encoding": "application/json",
        "json": {"invoice": 1},
    }
    assert json_record["job"]["custom"] == {"n": 3, "ratio": 0.5, "ok": True, "tenant": "acme"}
    assert (json_record["job"]["priority"], json_record["job"]["queue"]) == (3, "billing")
    assert text_record["job"]["payload"] == {
        "encoding": "text/plain; charset=utf-8",
        "text": "naïve text",
    }
    assert "drained 2 dead letter(s)" in done.stderr

    out = tmp_path / "dead.jsonl"
    out.write_text("earlier line\n")
    rest = await cli(sepp_server.address, "dead-letters", "drain", "--out", str(out))
    assert rest.returncode == 0 and rest.stdout == "", rest
    lines = out.read_text().splitlines()
    assert lines[0] == "earlier line"
    saved = [json.loads(line) for line in lines[1:]]
    assert [record["job"]["id"] for record in saved] == ids[2:]
    raw_record = saved[0]  # n=2
    assert raw_record["job"]["payload"] == {"encoding": "application/x-raw", "base64": "AP9yYXc="}
    assert await client.drain_dead_letters(max=10) == []


def saved_files(directory: Path) -> list[Path]:
    return list(directory.glob("dead-letters-*.jsonl"))


async def test_replay_saves_the_records_then_enqueues_them_as_new_jobs(
    sepp_server: SeppServer, client: sepp.Client, tmp_path: Path
) -> None:
    ids = await make_dead_letters(client, "billing", 4)
    done = await cli(sepp_server.address, "dead-letters", "replay", cwd=tmp_path)
    assert done.returncode == 0, done
    (saved,) = saved_files(tmp_path)
    assert done.stdout_lines == [f"replayed 4 of 4 dead letter(s); records saved in {saved.name}"]
    assert [json.loads(line)["job"]["id"] for line in saved.read_text().splitlines()] == ids
    jobs = await reserve_all(client, "billing", 4)
    assert sorted(job.ctx.custom["n"] for job in jobs) == [0, 1, 2, 3]
    assert {job.id for job in jobs}.isdisjoint(ids)  # new jobs
    by_n = {job.ctx.custom["n"]: job for job in jobs}
    assert by_n[2].payload == sepp.Payload(b"\x00\xffraw", "application/x-raw")
    assert by_n[3].ctx.priority == 3 and by_n[3].ctx.attempt == 1

    # Replaying the same records again (as after a failure) does not duplicate them.
    again = await cli(sepp_server.address, "dead-letters", "replay", "--from", str(saved))
    assert again.returncode == 0, again
    assert again.stdout.startswith("replayed 0 of 4 dead letter(s) (4 had been replayed before)")
    assert await client.reserve("billing", lease_duration=1, wait_timeout=0) is None

    nothing = await cli(sepp_server.address, "dead-letters", "replay", cwd=tmp_path)
    assert nothing.returncode == 0, nothing
    assert nothing.stdout_lines == ["replayed 0 dead letters: there were none"]
    assert saved_files(tmp_path) == [saved]  # no empty file left behind


async def test_two_replays_in_the_same_second_each_save_to_a_new_file(
    sepp_server: SeppServer,
    client: sepp.Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The clock is frozen, so both replays pick their default name in the same second.
    frozen = datetime(2026, 11, 30, 14, 38, 31, tzinfo=timezone.utc)
    monkeypatch.setattr(_dead_letters, "_utc_now", lambda: frozen)
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["--address", sepp_server.address, "dead-letters", "replay"])
    first = await make_dead_letters(client, "billing", 2)
    assert await _dead_letters.run_replay(args) == 0
    second = await make_dead_letters(client, "billing", 3)
    assert await _dead_letters.run_replay(args) == 0
    names = ["dead-letters-20261130T143831Z.jsonl", "dead-letters-20261130T143831Z-2.jsonl"]
    assert capsys.readouterr().out.splitlines() == [
        f"replayed 2 of 2 dead letter(s); records saved in {names[0]}",
        f"replayed 3 of 3 dead letter(s); records saved in {names[1]}",
    ]
    saved = [(tmp_path / name).read_text().splitlines() for name in names]
    assert [[json.loads(line)["job"]["id"] for line in lines] for lines in saved] == [first, second]


async def test_replay_keeps_every_record_when_the_server_dies_before_the_enqueue(
    tmp_path: Path,
) -> None:
    # persist_mode sync_all: the drain is durable on the server, so the file is the only copy.
    durable = config(storage={"persist_mode": "sync_all", "dead_letter_retention_ms": 600_000})
    saved = tmp_path / "saved.jsonl"
    async with sepp_server(durable) as server:
        async with sepp.open(server.address) as client:
            ids = await make_dead_letters(client, "billing", 6)
        async with spawn(
            server.address,
            *("dead-letters", "replay", "--save", str(saved)),
            env={"_SEPP_TRIO_TEST_PAUSE_BEFORE_REPLAY": "1"},
        ) as running:
            await running.wait_for("paused before re-enqueueing")
            await server.stop(kill=True)  # the server dies between the drain and the enqueue
            assert running.process.stdin is not None
            await running.process.stdin.send_all(b"\n")
            status = await running.wait()
        assert status == 1
        stderr = running.text("stderr").strip()
        assert "Traceback" not in stderr
        assert "re-enqueueing failed after 0 of 6" in stderr
        assert f"Every drained record is saved in {saved}" in stderr
        assert f"replay --from {saved}" in stderr
        records = [json.loads(line) for line in saved.read_text().splitlines()]
        assert [record["job"]["id"] for record in records] == ids

        await server.start()
        async with sepp.open(server.address) as client:
            assert await client.drain_dead_letters(max=10) == []  # the drain was for real
            finish = await cli(server.address, "dead-letters", "replay", "--from", str(saved))
            assert finish.returncode == 0, finish
            assert finish.stdout.startswith("replayed 6 of 6 dead letter(s)")
            jobs = await reserve_all(client, "billing", 6)
        assert sorted(job.ctx.custom["n"] for job in jobs) == list(range(6))


# -- worker -----------------------------------------------------------------------------------

APP = textwrap.dedent(
    """
    import trio
    import sepp

    router = sepp.Router()

    @router.handler("work")
    async def work(payload, ctx):
        print("done", ctx.id, payload.json()["n"], flush=True)

    @router.handler("finish")
    async def finish(payload, ctx):
        print("started", ctx.id, flush=True)
        await trio.sleep(1)
        print("finished", ctx.id, flush=True)

    @router.handler("block")
    async def block(payload, ctx):
        print("started", ctx.id, flush=True)
        await trio.sleep_forever()

    def make_router():
        return sepp.Router().include(router)

    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(worker):
        print("lifespan open", flush=True)
        yield "the-pool"
        print("lifespan closed", flush=True)

    app = sepp.Router(lifespan=lifespan).include(router)

    @app.handler("stateful")
    async def stateful(payload, ctx):
        print("state", ctx.state, flush=True)
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "jobs_app.py").write_text(APP)
    return tmp_path


@asynccontextmanager
async def worker(
    server: SeppServer, app_dir: Path, target: str, *, shutdown_timeout: float
) -> AsyncIterator[Running]:
    """`sepp-trio worker TARGET --queue work` run from `app_dir`, once it is reserving."""
    args = ("worker", target, "--queue", "work", "--shutdown-timeout", str(shutdown_timeout))
    async with spawn(server.address, *args, cwd=app_dir) as running:
        await running.wait_for("reserving from work")
        yield running


@pytest.mark.arch_smoke  # (the round trip)
async def test_worker_processes_jobs_and_sigterm_lets_the_running_job_finish(
    sepp_server: SeppServer, client: sepp.Client, app_dir: Path
) -> None:
    async with worker(sepp_server, app_dir, "jobs_app:make_router", shutdown_timeout=30) as running:
        for n in range(20):
            await client.enqueue("work", "work", payload=sepp.Payload.json({"n": n}))
        await running.wait_for("done ", "stdout", count=20)
        ack = await client.enqueue("work", "finish")
        await running.wait_for(f"started {ack.job_id}", "stdout")
        running.send(signal.SIGTERM)
        # Well under the 30 s shutdown timeout: the worker waited for the job, not the clock.
        status = await running.wait(timeout_s=20)
    assert status == 0, running.out
    stdout = running.text("stdout")
    assert sorted(
        int(line.split()[2]) for line in stdout.splitlines() if line.startswith("done")
    ) == list(range(20))
    assert f"finished {ack.job_id}" in stdout
    stderr = running.text("stderr")
    assert "SIGTERM: shutting down" in stderr and "stopped" in stderr
    assert "Traceback" not in stderr and "ERROR" not in stderr
    # Nothing in flight and nothing nacked: every job was acked.
    assert await client.reserve("work", lease_duration=1, wait_timeout=0) is None
    assert await client.drain_dead_letters(max=50) == []


async def test_a_second_signal_stops_at_once_and_returns_the_jobs_to_the_queue(
    sepp_server: SeppServer, client: sepp.Client, app_dir: Path
) -> None:
    async with worker(sepp_server, app_dir, "jobs_app:router", shutdown_timeout=600) as running:
        ids = [(await client.enqueue("work", "block")).job_id for _ in range(3)]
        await running.wait_for("started", "stdout", count=3)
        running.send(signal.SIGTERM)
        await running.wait_for("SIGTERM: shutting down")
        running.send(signal.SIGINT)
        status = await running.wait(timeout_s=20)  # not the 600 s shutdown timeout
    assert status == 0, running.out
    assert "SIGINT, a second signal: stopping now; cancelling 3 job(s)" in running.text("stderr")
    # Nacked for immediate retry, not left to their 30 s leases: they are back at once.
    jobs = await client.reserve("work", lease_duration=30, wait_timeout=0, max_jobs=10) or []
    assert sorted(job.id for job in jobs) == sorted(ids)
    assert all(job.ctx.attempt == 2 for job in jobs)


async def test_worker_enters_the_routers_lifespan_around_the_jobs(
    sepp_server: SeppServer, client: sepp.Client, app_dir: Path
) -> None:
    async with worker(sepp_server, app_dir, "jobs_app:app", shutdown_timeout=30) as running:
        await client.enqueue("work", "stateful")
        await running.wait_for("state the-pool", "stdout")
        running.send(signal.SIGTERM)
        status = await running.wait(timeout_s=20)
    assert status == 0, running.out
    lines = running.text("stdout").splitlines()
    assert lines == ["lifespan open", "state the-pool", "lifespan closed"]


ASYNCIO_APP = textwrap.dedent(
    """
    import asyncio
    import contextlib

    import sepp


    @contextlib.asynccontextmanager
    async def lifespan():
        print("lifespan on", type(asyncio.get_running_loop()).__module__, flush=True)
        yield
        print("lifespan closed", flush=True)

    router = sepp.Router(lifespan=lifespan)


    @router.handler("work")
    async def work(payload, ctx):
        await asyncio.sleep(0)  # only asyncio could run this handler
        print("done", payload.json()["n"], flush=True)


    @router.handler("block")
    async def block(payload, ctx):
        print("started", ctx.id, flush=True)
        await asyncio.Event().wait()
    """
)


@pytest.mark.parametrize(
    "loop", ["asyncio", pytest.param("uvloop", marks=pytest.mark.needs("uvloop"))]
)
async def test_worker_loop_asyncio_runs_asyncio_handlers_and_stops_on_signals(
    sepp_server: SeppServer, client: sepp.Client, tmp_path: Path, loop: str
) -> None:
    (tmp_path / "aio_app.py").write_text(ASYNCIO_APP)
    args = ("worker", "aio_app:router", "--queue", "work", "--loop", loop, "--health-port", "0")
    async with spawn(sepp_server.address, *args, cwd=tmp_path) as running:
        await running.wait_for("reserving from work")
        for n in range(10):
            await client.enqueue("work", "work", payload=sepp.Payload.json({"n": n}))
        await running.wait_for("done ", "stdout", count=10)
        # Acked, not only done: a job still settling counts as in flight, and the second
        # signal's line below says how many it cancels.
        await running.wait_for("finished: ack", count=10)
        blocked = (await client.enqueue("work", "block")).job_id
        await running.wait_for(f"started {blocked}", "stdout")
        running.send(signal.SIGTERM)
        await running.wait_for("SIGTERM: shutting down")
        running.send(signal.SIGINT)
        status = await running.wait(timeout_s=20)
    assert status == 0, running.out
    stdout = running.text("stdout").splitlines()
    module = "uvloop" if loop == "uvloop" else "asyncio.unix_events"
    assert stdout[0] == f"lifespan on {module}" and stdout[-1] == "lifespan closed"
    assert sorted(int(line.split()[1]) for line in stdout if line.startswith("done")) == list(
        range(10)
    )
    stderr = running.text("stderr")
    assert "serving /healthz /readyz on *:" in stderr
    assert "SIGINT, a second signal: stopping now; cancelling 1 job(s)" in stderr
    assert "Traceback" not in stderr
    jobs = await client.reserve("work", lease_duration=30, wait_timeout=0, max_jobs=10) or []
    assert [job.id for job in jobs] == [blocked]  # returned at once by the second signal


# -- scheduler --------------------------------------------------------------------------------

SCHEDULE_APP = textwrap.dedent(
    """
    import sepp

    schedule = sepp.Schedule().every("tick", 1, "ticks", "tick", priority=4)
    """
)


@pytest.fixture
def schedule_dir(tmp_path: Path) -> Path:
    (tmp_path / "schedule_app.py").write_text(SCHEDULE_APP)
    return tmp_path


async def test_scheduler_waits_for_the_server_then_enqueues_each_occurrence_once(
    sepp_server: SeppServer, schedule_dir: Path
) -> None:
    await sepp_server.stop()  # started alongside the server, before it is up
    args = ("scheduler", "schedule_app:schedule", "--lookahead", "2")
    async with spawn(sepp_server.address, *args, cwd=schedule_dir) as running:
        await running.wait_for("server not reachable yet")
        await sepp_server.start()
        await running.wait_for("scheduler enqueueing tick at")
        async with sepp.open(sepp_server.address) as client:
            jobs = await reserve_all(client, "ticks", 4)
            running.send(signal.SIGTERM)
            status = await running.wait(timeout_s=20)
            occurrences = [
                datetime.fromisoformat(job.ctx.custom["sepp.occurrence"].replace("Z", "+00:00"))
                for job in jobs
            ]
            # Each job is one occurrence, scheduled at it, keyed by it.
            assert len(set(occurrences)) == len(jobs)
            for job, occurrence in zip(jobs, occurrences, strict=True):
                assert job.ctx.scheduled_at == occurrence and occurrence.microsecond == 0
                assert (job.ctx.job_type, job.ctx.priority) == ("tick", 4)
                assert job.ctx.custom["sepp.schedule"] == "tick"
            key = f"sepp-schedule:tick:{jobs[0].ctx.custom['sepp.occurrence']}"
            again = await client.enqueue("ticks", "tick", idempotency_key=key)
            assert again.deduplicated and again.job_id == jobs[0].id
    assert status == 0, running.out
    stderr = running.text("stderr")
    assert "SIGTERM: stopping the scheduler" in stderr and "scheduler stopped" in stderr
    assert "Traceback" not in stderr and "ERROR" not in stderr


async def test_scheduler_stops_at_once_on_a_signal_while_the_server_is_down(
    schedule_dir: Path,
) -> None:
    args = ("scheduler", "schedule_app:schedule")
    async with spawn(UNUSED_ADDRESS, *args, cwd=schedule_dir) as running:
        await running.wait_for("server not reachable yet", count=2)
        running.send(signal.SIGINT)
        status = await running.wait(timeout_s=20)
    assert status == 0, running.out
    stderr = running.text("stderr")
    assert "failure 2); retrying in" in stderr
    assert "SIGINT: stopping the scheduler" in stderr and "scheduler stopped" in stderr
    assert "Traceback" not in stderr


@pytest.mark.unit  # refused before any connection: no server needed
async def test_scheduler_settings_are_checked_before_connecting(schedule_dir: Path) -> None:
    done = await cli(
        UNUSED_ADDRESS,
        "scheduler",
        "schedule_app:schedule",
        "--lookahead",
        "9999999",
        cwd=schedule_dir,
    )
    assert_one_line_failure(done, 2, "lookahead:", "beyond the server's default schedule horizon")


# -- the API key --------------------------------------------------------------------------------

API_KEY = "cli-secret-key-4f1d"


async def test_the_api_key_comes_from_the_environment_only_and_is_never_printed(
    tmp_path: Path,
) -> None:
    keyed = config(auth={"api_keys": [{"name": "ops", "key": API_KEY}]})
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(job_lines(3))
    async with sepp_server(keyed) as server:
        env = {"SEPP_API_KEY": API_KEY}
        runs = [
            await cli(server.address, "--log-level", "debug", "info", env=env),
            await cli(server.address, "--log-level", "debug", "enqueue", "q", "t", env=env),
            await cli(server.address, "--log-level", "debug", "enqueue-file", str(jobs), env=env),
            await cli(server.address, "--log-level", "debug", "dead-letters", "drain", env=env),
        ]
        for done in runs:
            assert done.returncode == 0, done
        # A wrong key fails cleanly, and neither key shows up.
        wrong = await cli(server.address, "--debug", "info", env={"SEPP_API_KEY": "wrong-key-77"})
        assert wrong.returncode == 1
        assert "UNAUTHENTICATED" in wrong.stderr and "$SEPP_API_KEY" in wrong.stderr
        assert "wrong-key-77" not in wrong.stdout + wrong.stderr
        missing = await cli(server.address, "info")
        assert_one_line_failure(missing, 1, "UNAUTHENTICATED")
        # Never a flag, in any spelling, and the refusal does not echo it.
        flags = [
            await cli(server.address, "--api-key", API_KEY, "info"),
            await cli(server.address, f"--api-key={API_KEY}", "info"),
            await cli(server.address, "info", "--api_key", API_KEY),
            await cli(server.address, "enqueue", "q", "t", f"--token={API_KEY}"),
        ]
        for done in flags:
            assert_one_line_failure(done, 2, "read only from $SEPP_API_KEY, never from a flag")
        for done in [*runs, wrong, missing, *flags]:
            assert API_KEY not in done.stdout + done.stderr


async def test_a_worker_whose_key_is_refused_announces_itself_only_once_it_is_accepted(
    app_dir: Path,
) -> None:
    late_key = "late-key-5e0a"
    ops = {"name": "ops", "key": API_KEY}
    async with sepp_server(config(auth={"api_keys": [ops]})) as server:
        args = ("worker", "jobs_app:router", "--queue", "work", "--log-format", "json")
        async with spawn(
            server.address, *args, env={"SEPP_API_KEY": late_key}, cwd=app_dir
        ) as running:
            await running.wait_for("cannot reserve from", count=2)
            assert "reserving from" not in running.text("stderr")
            mark = server.output_line_count
            server.update_config(
                config(auth={"api_keys": [ops, {"name": "late", "key": late_key}]})
            )
            with trio.fail_after(TIMEOUT_S):
                await server.wait_for_output("configuration reloaded", after=mark)
            await running.wait_for("reserving from work")
            running.send(signal.SIGTERM)
            status = await running.wait()
    assert status == 0, running.out
    records = [json.loads(line) for line in running.text("stderr").splitlines()]  # all JSON
    levels = {r["level"] for r in records if "reserving from" in r["message"]}
    assert levels == {"INFO"}
    refused = [r for r in records if "cannot reserve from" in r["message"]]
    assert refused and all(r["level"] == "ERROR" for r in refused)
    assert late_key not in running.text("stderr")
