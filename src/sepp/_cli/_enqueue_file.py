"""`sepp-trio enqueue-file`: jobs from JSON lines, sent in EnqueueBatch chunks."""

from __future__ import annotations

import argparse
import io
import select
import sys
from dataclasses import dataclass
from typing import Any

import trio

import sepp

from ._connect import open_client
from ._failures import EXIT_FAILURE, EXIT_OK, CliError
from ._output import Progress, note
from ._tasks import load_task, typed_payload
from ._values import strict_json, timestamp

JOB_KEYS = (
    "queue",
    "job_type",
    "json",
    "text",
    "priority",
    "max_attempts",
    "idempotency_key",
    "custom",
    "scheduled_at",
)
# A chunk also ends before it passes this many bytes of input, well under the server's
# 16 MiB message cap, whatever max_enqueue_batch allows.
MAX_CHUNK_BYTES = 4 * 1024 * 1024
READ_BYTES = 1024 * 1024
FALLBACK_MAX_BATCH = 256


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "enqueue-file",
        help="enqueue jobs from a file of JSON lines",
        description="Enqueue one job per line of FILE (- for stdin), each a JSON object with"
        ' "queue" and "job_type", and optionally "json" (any JSON value) or "text",'
        ' "priority", "max_attempts", "idempotency_key", "custom" (an object) and'
        ' "scheduled_at" (ISO 8601 with an offset). Blank lines are skipped. Jobs go out in'
        " EnqueueBatch chunks of at most the server's max_enqueue_batch. Invalid and rejected"
        " lines are reported on stderr with their numbers; the summary goes to stdout. Exit"
        " status 1 if any line was invalid or rejected. With --task MODULE:ATTR (a sepp.Task),"
        ' "queue" and "job_type" default to the task\'s, its defaults apply, and each "json"'
        " is checked against the task's payload type (a line that does not fit is invalid)."
        " Stopped by Ctrl-C or a failure, it prints the first line not confirmed (every line"
        " before it was handled): --start-at that line resumes there. Lines without an"
        ' "idempotency_key" are enqueued again by a rerun, so the first one is warned about.',
    )
    parser.add_argument("file", metavar="FILE|-")
    parser.add_argument(
        "--start-at",
        metavar="LINE",
        type=_line_number,
        default=1,
        help="skip the lines before LINE (1-based, as reported): resume an interrupted run",
    )
    parser.add_argument(
        "--task",
        metavar="MODULE:ATTR",
        help='a sepp.Task: every line is one of its jobs, its "json" checked against its type',
    )
    parser.set_defaults(run=run)


def _line_number(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a line number (1 or more), got {text!r}")
    return number


class InvalidLine(ValueError):
    """A line that does not describe a job."""


def request_from_line(line: str, task: sepp.Task[Any] | None = None) -> sepp.EnqueueRequest:
    try:
        job = strict_json(line)
    except ValueError as exc:
        raise InvalidLine(f"not JSON: {exc}") from None
    if not isinstance(job, dict):
        raise InvalidLine(f"expected a JSON object, got {type(job).__name__}")
    unknown = sorted(set(job) - set(JOB_KEYS))
    if unknown:
        raise InvalidLine(f"unknown key(s) {', '.join(map(repr, unknown))}")
    if task is not None:
        return _task_request(job, task)
    for key in ("queue", "job_type"):
        if key not in job:
            raise InvalidLine(f"{key!r} is required")
    if "json" in job and "text" in job:
        raise InvalidLine("give 'json' or 'text', not both")
    custom = job.get("custom", {})
    if not isinstance(custom, dict):
        raise InvalidLine(f"'custom' must be an object, got {type(custom).__name__}")
    scheduled_at = job.get("scheduled_at")
    try:
        if scheduled_at is not None:
            if not isinstance(scheduled_at, str):
                raise InvalidLine("'scheduled_at' must be an ISO 8601 string")
            scheduled_at = timestamp(scheduled_at)
        payload = None
        if "json" in job:
            payload = sepp.Payload.json(job["json"])
        elif "text" in job:
            payload = sepp.Payload.text(job["text"])
        return sepp.EnqueueRequest(
            job["queue"],
            job["job_type"],
            payload=payload,
            idempotency_key=job.get("idempotency_key"),
            priority=job.get("priority"),
            max_attempts=job.get("max_attempts"),
            custom=custom,
            scheduled_at=scheduled_at,
        )
    except (sepp.ValidationError, argparse.ArgumentTypeError) as exc:
        raise InvalidLine(str(exc)) from None


def _task_request(job: dict[str, Any], task: sepp.Task[Any]) -> sepp.EnqueueRequest:
    if job.get("job_type", task.job_type) != task.job_type:
        raise InvalidLine(f"job_type {job['job_type']!r} is not the task's {task.job_type!r}")
    if "text" in job:
        raise InvalidLine("a task's payload is 'json', not 'text'")
    try:
        payload = typed_payload(task, job.get("json"))
    except sepp.PayloadDecodeError as exc:
        raise InvalidLine(f"'json' does not fit task {task.job_type!r}: {exc}") from None
    scheduled_at = job.get("scheduled_at")
    try:
        if scheduled_at is not None:
            if not isinstance(scheduled_at, str):
                raise InvalidLine("'scheduled_at' must be an ISO 8601 string")
            scheduled_at = timestamp(scheduled_at)
        return task.encoded_request(
            payload,
            queue=job.get("queue"),
            idempotency_key=job.get("idempotency_key"),
            priority=job.get("priority"),
            max_attempts=job.get("max_attempts"),
            custom=job.get("custom"),
            scheduled_at=scheduled_at,
        )
    except (sepp.ValidationError, argparse.ArgumentTypeError) as exc:
        raise InvalidLine(str(exc)) from None


@dataclass
class Tally:
    enqueued: int = 0
    deduplicated: int = 0
    rejected: int = 0
    invalid: int = 0

    def __str__(self) -> str:
        return (
            f"{self.enqueued} enqueued, {self.deduplicated} deduplicated,"
            f" {self.rejected} rejected, {self.invalid} invalid"
        )


class _Loader:
    """Reads numbered lines, reports bad ones, and sends the rest in chunks."""

    def __init__(
        self, client: sepp.Client, max_batch: int, task: sepp.Task[Any] | None = None
    ) -> None:
        self.client = client
        self.task = task
        self.max_batch = max_batch
        self.tally = Tally()
        self.progress = Progress()
        self.lines_read = 0
        self._chunk: list[tuple[int, sepp.EnqueueRequest]] = []
        self._chunk_bytes = 0
        self._sending_from: int | None = None  # the first line of the chunk on its way
        self._warned_keyless = False

    def first_unconfirmed(self) -> int:
        """The first line whose outcome is not known: every line before it was enqueued,
        deduplicated, rejected or invalid (and reported); rerunning from it loses nothing."""
        pending = [first for first in (self._sending_from,) if first is not None]
        if self._chunk:
            pending.append(self._chunk[0][0])
        return min(pending, default=self.lines_read + 1)

    async def add(self, line_number: int, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            request = request_from_line(raw.decode("utf-8"), self.task)
        except (InvalidLine, UnicodeDecodeError) as exc:
            self.tally.invalid += 1
            self.progress.note(f"line {line_number}: invalid: {exc}")
            return
        if request.idempotency_key is None and not self._warned_keyless:
            self._warned_keyless = True
            self.progress.note(
                f"line {line_number}: warning: no idempotency_key: a rerun of this file would"
                " enqueue such lines again (give each line a key to make reruns exact)"
            )
        full = len(self._chunk) >= self.max_batch
        if self._chunk and (full or self._chunk_bytes + len(raw) > MAX_CHUNK_BYTES):
            await self.flush()
        self._chunk.append((line_number, request))
        self._chunk_bytes += len(raw)

    async def flush(self) -> None:
        chunk, self._chunk, self._chunk_bytes = self._chunk, [], 0
        if not chunk:
            return
        self._sending_from = chunk[0][0]
        try:
            results = await self.client.enqueue_batch([request for _, request in chunk])
        except sepp.SeppError as exc:
            self.progress.clear()
            print(self.tally, flush=True)
            first, last = chunk[0][0], chunk[-1][0]
            raise CliError(
                f"sending lines {first}-{last} failed: {exc}. Lines before {first} were"
                f" handled as counted on stdout; lines {first}-{last} may or may not have been"
                f" enqueued; nothing after line {last} was sent; resume with --start-at {first}"
            ) from exc
        self._sending_from = None
        for (line_number, _), result in zip(chunk, results, strict=True):
            if isinstance(result, sepp.EnqueueAck):
                if result.deduplicated:
                    self.tally.deduplicated += 1
                else:
                    self.tally.enqueued += 1
            else:
                self.tally.rejected += 1
                reason = sepp.describe_job_rejection(result)
                self.progress.note(f"line {line_number}: rejected: {reason}")
        self.progress.update(f"{self.lines_read} lines read: {self.tally}")


def _report_interrupted(loader: _Loader) -> None:
    loader.progress.clear()
    print(loader.tally, flush=True)
    first = loader.first_unconfirmed()
    note(
        f"interrupted before line {first} was confirmed (every line before it was handled):"
        f" resume with --start-at {first}"
    )


def _open_source(path: str) -> io.BufferedReader:
    if path == "-":
        return open(sys.stdin.fileno(), "rb", closefd=False)
    return open(path, "rb")


def _more_input_ready(source: io.BufferedReader) -> bool:
    """Whether the next read returns at once: always for a regular file (or a source without
    a file descriptor), for a pipe or terminal only when its writer has sent more."""
    try:
        fd = source.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


async def _load(loader: _Loader, source: io.BufferedReader, start_at: int = 1) -> None:
    line_number = 0
    partial = b""
    while True:
        # In a worker thread, so the connection's tasks keep running; read1 returns what is
        # there (however little: 4 KiB on PyPy), so lines from a slow producer on stdin can go
        # out as they come.
        data = await trio.to_thread.run_sync(source.read1, READ_BYTES, abandon_on_cancel=True)
        *lines, partial = (partial + data).split(b"\n") if data else (partial, b"")
        for raw in lines:
            line_number += 1
            loader.lines_read = line_number
            if line_number >= start_at:
                await loader.add(line_number, raw)
        # A part-full chunk goes out only before a read that would wait, or at the end:
        # full chunks otherwise, whatever each read returned.
        if not data or not _more_input_ready(source):
            await loader.flush()
        if not data:
            return


async def run(args: argparse.Namespace) -> int:
    task = load_task(args.task) if args.task is not None else None
    source = await trio.to_thread.run_sync(_open_source, args.file)
    try:
        async with open_client(args) as client:
            info = await client.get_server_info()
            loader = _Loader(client, info.max_enqueue_batch or FALLBACK_MAX_BATCH, task)
            try:
                await _load(loader, source, args.start_at)
            except KeyboardInterrupt:
                _report_interrupted(loader)
                raise
    finally:
        if args.file != "-":
            # Not stdin: a read abandoned by Ctrl-C may still hold the reader's lock there,
            # and close() would wait for it (for ever, on a pipe nobody writes to).
            source.close()
    loader.progress.clear()
    print(loader.tally, flush=True)
    if args.start_at > loader.lines_read + 1 and loader.lines_read:
        note(f"--start-at {args.start_at} is past the last line ({loader.lines_read})")
    return EXIT_FAILURE if loader.tally.rejected or loader.tally.invalid else EXIT_OK
