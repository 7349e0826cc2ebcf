"""`sepp-trio dead-letters list|drain|replay`: look at dead-lettered jobs in place (admin API),
or take them off the server, durably."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TextIO
from urllib.parse import quote

import trio

import sepp

from ._admin import AdminApi, add_admin_options
from ._connect import open_client
from ._failures import EXIT_FAILURE, EXIT_OK, CliError, UsageError
from ._output import Progress, json_line, note
from ._records import record_from_json, record_line, replay_request
from ._values import positive_int

FALLBACK_BATCH = 256
# Tests only: pause between saving the drained records and re-enqueueing them, until a line
# arrives on stdin, so a test can take the server down at exactly that point.
_PAUSE_BEFORE_REPLAY_ENV = "_SEPP_TRIO_TEST_PAUSE_BEFORE_REPLAY"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "dead-letters",
        help="list, drain or replay dead-lettered jobs",
        description="List dead-lettered jobs where they are (the admin API), drain them (a"
        " destructive read) or replay them as new jobs.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = actions.add_parser(
        "list",
        help="print dead letters as JSON lines, leaving them on the server (admin API)",
        description="Print dead letters as JSON lines (queue, job id, type, cause, failed_at,"
        " final attempt, last reason, custom map, payload encoding and size), oldest first,"
        " read from the server's admin API: nothing is drained. Without --queue, every queue"
        " that has dead letters.",
    )
    _add_selection(listing)
    add_admin_options(listing)
    listing.set_defaults(run=run_list)

    drain = actions.add_parser(
        "drain",
        help="remove dead letters from the server and print them as JSON lines",
        description="Remove dead letters from the server, oldest first, and write each as a"
        " JSON line (job snapshot, cause, failed_at, final_attempt, last_reason) to stdout or"
        " FILE. Draining is destructive: the server forgets what it returns.",
    )
    _add_selection(drain)
    drain.add_argument(
        "--out", metavar="FILE", help="append to FILE (fsynced after each batch) instead of stdout"
    )
    drain.set_defaults(run=run_drain)

    replay = actions.add_parser(
        "replay",
        help="drain dead letters, save them, and enqueue them again as new jobs",
        description="Drain dead letters, write them to FILE and fsync it, and only then enqueue"
        " each as a new job (new id, attempt 1, same type, payload, priority, max_attempts and"
        " custom map), keyed 'replay-<dead job id>' so that replaying the same records twice"
        " enqueues each job once. If re-enqueueing fails midway, FILE still holds every"
        " drained record: finish with --from FILE.",
    )
    _add_selection(replay)
    replay.add_argument(
        "--save",
        metavar="FILE",
        help="a new file for the drained records (default: dead-letters-<UTC time>.jsonl in"
        " the current directory)",
    )
    replay.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="replay the records saved in FILE (by drain or replay) instead of draining",
    )
    replay.set_defaults(run=run_replay)


def _add_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", metavar="Q", help="only this queue's dead letters")
    parser.add_argument(
        "--max", metavar="N", type=positive_int, help="at most N records (default: all)"
    )


class _RecordSink:
    """Writes records as JSON lines; with `durable`, fsyncs after every batch."""

    def __init__(self, file: TextIO, *, durable: bool) -> None:
        self.file = file
        self.durable = durable
        self.records: list[sepp.DeadLetterRecord] = []

    def write(self, records: list[sepp.DeadLetterRecord]) -> None:
        self.file.writelines(record_line(record) + "\n" for record in records)
        self.file.flush()
        if self.durable:
            os.fsync(self.file.fileno())
        self.records += records


async def _drain_into(
    client: sepp.Client, args: argparse.Namespace, sink: _RecordSink, where: str
) -> None:
    info = await client.get_server_info()
    # The server returns at most max_reserve_batch records per call.
    per_call = info.max_reserve_batch or FALLBACK_BATCH
    progress = Progress()
    while args.max is None or len(sink.records) < args.max:
        want = per_call if args.max is None else min(per_call, args.max - len(sink.records))
        try:
            records = await client.drain_dead_letters(args.queue, max=want)
        except sepp.SeppError as exc:
            progress.clear()
            so_far = len(sink.records)
            kept = f" after {so_far} record(s), all written to {where}" if so_far else ""
            raise CliError(f"draining failed{kept}: {exc}") from exc
        if not records:
            break
        # Written (and fsynced) before the next drain: these are gone from the server.
        try:
            await trio.to_thread.run_sync(sink.write, records)
        except OSError as exc:
            progress.clear()
            raise CliError(
                f"writing to {where} failed: {exc}; up to {len(records)} record(s) just"
                " drained from the server may be lost"
            ) from exc
        progress.update(f"{len(sink.records)} drained")
    progress.clear()
    if not sink.records and not info.dead_letter_retention_enabled:
        note("note: this server keeps no dead letters (storage.dead_letter_retention_ms = 0)")


def _open_output(path: str | None) -> TextIO:
    return sys.stdout if path is None else open(path, "a", encoding="utf-8")


async def run_drain(args: argparse.Namespace) -> int:
    file = await trio.to_thread.run_sync(_open_output, args.out)
    try:
        sink = _RecordSink(file, durable=args.out is not None)
        async with open_client(args) as client:
            await _drain_into(client, args, sink, args.out or "stdout")
    finally:
        if file is not sys.stdout:
            file.close()
    note(f"drained {len(sink.records)} dead letter(s)" + (f" into {args.out}" if args.out else ""))
    return EXIT_OK


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _create_default(now: datetime) -> tuple[str, TextIO]:
    # Named to the second, so two replays in one second (or one per host in a shared
    # directory) would collide: the first free of NAME, NAME-2, NAME-3... is taken atomically.
    stem = f"dead-letters-{now:%Y%m%dT%H%M%SZ}"
    for number in range(1, 10_000):
        path = f"{stem}.jsonl" if number == 1 else f"{stem}-{number}.jsonl"
        try:
            return path, open(path, "x", encoding="utf-8")
        except FileExistsError:
            continue
    raise CliError(f"{stem}-*.jsonl: every name is taken; choose a file with --save")


def _create_new(path: str) -> TextIO:
    try:
        return open(path, "x", encoding="utf-8")
    except FileExistsError:
        raise CliError(
            f"{path} exists; replay saves into a new file (choose another --save)"
        ) from None


def _fsync_directory(path: str) -> None:
    # A new file's name is durable only once its directory is synced (POSIX; best effort).
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_records(path: str) -> list[sepp.DeadLetterRecord]:
    records: list[sepp.DeadLetterRecord] = []
    problems: list[str] = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                records.append(record_from_json(json.loads(line)))
            except ValueError as exc:  # bad JSON, RecordFormatError, ValidationError
                problems.append(f"{path}: line {number}: not a dead-letter record: {exc}")
    if problems:
        for problem in problems:
            note(problem)
        raise CliError(f"{path} has {len(problems)} invalid line(s); nothing was replayed")
    return records


@dataclass
class _ReplayTally:
    replayed: int = 0
    already: int = 0  # deduplicated: replayed by an earlier run
    rejected: int = 0


async def _replay_chunks(
    client: sepp.Client,
    records: list[sepp.DeadLetterRecord],
    tally: _ReplayTally,
    progress: Progress,
) -> None:
    per_call = (await client.get_server_info()).max_enqueue_batch or FALLBACK_BATCH
    for start in range(0, len(records), per_call):
        chunk = records[start : start + per_call]
        results = await client.enqueue_batch([replay_request(r) for r in chunk])
        for number, (record, result) in enumerate(zip(chunk, results, strict=True), start + 1):
            if isinstance(result, sepp.EnqueueAck):
                tally.already += result.deduplicated
                tally.replayed += not result.deduplicated
            else:
                tally.rejected += 1
                reason = sepp.describe_job_rejection(result)
                progress.note(f"record {number} (job {record.job_id} on {record.queue}): {reason}")
        progress.update(f"{tally.replayed + tally.already} of {len(records)} replayed")


async def _replay(
    client: sepp.Client, records: list[sepp.DeadLetterRecord], path: str, *, drained: bool
) -> int:
    tally = _ReplayTally()
    progress = Progress()
    try:
        await _replay_chunks(client, records, tally, progress)
    except sepp.SeppError as exc:
        progress.clear()
        done = tally.replayed + tally.already + tally.rejected
        kept = "Every drained record is saved in" if drained else "The records are in"
        raise CliError(
            f"re-enqueueing failed after {done} of {len(records)}: {exc}. {kept} {path};"
            f" finish with: sepp-trio dead-letters replay --from {shlex.quote(path)} (jobs"
            " already replayed are not duplicated)"
        ) from exc
    progress.clear()
    earlier = f" ({tally.already} had been replayed before)" if tally.already else ""
    rejections = f", {tally.rejected} rejected" if tally.rejected else ""
    where = "records saved in" if drained else "records from"
    print(
        f"replayed {tally.replayed} of {len(records)} dead letter(s){earlier}{rejections};"
        f" {where} {path}",
        flush=True,
    )
    return EXIT_FAILURE if tally.rejected else EXIT_OK


async def _pause_if_testing() -> None:
    if os.environ.get(_PAUSE_BEFORE_REPLAY_ENV):
        note("paused before re-enqueueing")
        await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)


async def run_replay(args: argparse.Namespace) -> int:
    if args.from_file is not None:
        if args.save is not None or args.queue is not None or args.max is not None:
            raise UsageError("--from replays a saved file: --save, --queue and --max do not apply")
        records = await trio.to_thread.run_sync(_read_records, args.from_file)
        async with open_client(args) as client:
            return await _replay(client, records, args.from_file, drained=False)

    async with open_client(args) as client:
        if args.save is not None:
            path = args.save
            file = await trio.to_thread.run_sync(_create_new, path)
        else:
            path, file = await trio.to_thread.run_sync(_create_default, _utc_now())
        with file:
            sink = _RecordSink(file, durable=True)
            try:
                await _drain_into(client, args, sink, path)
            finally:
                if not sink.records:  # nothing drained (or a failure first): no empty file
                    os.remove(path)
            if not sink.records:
                print("replayed 0 dead letters: there were none", flush=True)
                return EXIT_OK
            await trio.to_thread.run_sync(_fsync_directory, path)
            await _pause_if_testing()
            return await _replay(client, sink.records, path, drained=True)


ADMIN_PAGE = 100  # the admin API's largest page


def listed_record(queue: str, entry: dict[str, object]) -> dict[str, object]:
    """One admin API dead letter in the shape `drain` prints where they overlap (seconds and
    ISO 8601 times, not milliseconds)."""

    def iso(ms: object) -> str | None:
        if not isinstance(ms, int) or ms <= 0:
            return None
        return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat()

    payload = entry.get("payload")
    return {
        "queue": queue,
        "job_id": entry.get("id"),
        "job_type": entry.get("job_type"),
        "cause": entry.get("cause"),
        "failed_at": iso(entry.get("failed_at_ms")),
        "final_attempt": entry.get("attempt"),
        "max_attempts": entry.get("max_attempts"),
        "last_reason": entry.get("last_reason"),
        "priority": entry.get("priority"),
        "enqueued_at": iso(entry.get("enqueued_at_ms")),
        "custom": entry.get("custom") or {},
        "payload": {
            "encoding": payload.get("encoding", "") if isinstance(payload, dict) else "",
            "size_bytes": payload.get("size_bytes", 0) if isinstance(payload, dict) else 0,
        },
    }


async def run_list(args: argparse.Namespace) -> int:
    api = AdminApi.from_args(args)
    if args.queue is not None:
        queues = [args.queue]
    else:
        listed = await api.get("/queues")
        queues = sorted(
            str(entry["name"])
            for entry in listed
            if isinstance(entry, dict)
            and int((entry.get("depths") or {}).get("dead_lettered", 0)) > 0
        )
    printed = 0
    for queue in queues:
        cursor: str | None = None
        while args.max is None or printed < args.max:
            want = ADMIN_PAGE if args.max is None else min(ADMIN_PAGE, args.max - printed)
            page = await api.get(
                f"/queues/{quote(queue, safe='')}/jobs",
                state="dead_letter",
                limit=want,
                cursor=cursor,
            )
            for entry in page.get("jobs", [])[:want]:
                print(json_line(listed_record(queue, entry)))
                printed += 1
            cursor = page.get("next_cursor")
            if not cursor:
                break
    return EXIT_OK
