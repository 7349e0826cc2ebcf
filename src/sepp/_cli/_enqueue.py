"""`sepp-trio enqueue`: one job; its id on stdout."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

import sepp

from .._model.types import BYTES_ENCODING
from .._model.validate import CustomValue
from ._connect import open_client
from ._failures import EXIT_OK, UsageError
from ._output import note
from ._tasks import load_task, typed_payload
from ._values import (
    after,
    custom_entry,
    custom_str_entry,
    positive_int,
    seconds,
    strict_json,
    timestamp,
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "enqueue",
        help="enqueue one job and print its id",
        description="Enqueue one job and print its id (one line) on stdout. A job whose"
        " idempotency key was seen before is not enqueued again: the earlier job's id is"
        " printed and a note goes to stderr. With --task MODULE:ATTR (a sepp.Task) instead of"
        " QUEUE JOB_TYPE, --json is checked against the task's payload type before anything is"
        " sent, and the task's defaults apply.",
    )
    parser.add_argument("queue", metavar="QUEUE", nargs="?")
    parser.add_argument("job_type", metavar="JOB_TYPE", nargs="?")
    parser.add_argument(
        "--task",
        metavar="MODULE:ATTR",
        help="a sepp.Task: its queue, job type and defaults, and --json checked against its type",
    )
    body = parser.add_argument_group("payload (at most one; default: none)")
    choice = body.add_mutually_exclusive_group()
    choice.add_argument("--json", metavar="VALUE", help="a JSON document, e.g. '{\"user\": 42}'")
    choice.add_argument("--text", metavar="TEXT", help="UTF-8 text")
    choice.add_argument("--data-file", metavar="PATH", help="raw bytes from a file (- for stdin)")
    body.add_argument(
        "--encoding",
        metavar="E",
        help=f"the encoding label of --data-file (default: {BYTES_ENCODING})",
    )
    parser.add_argument("--priority", metavar="N", type=int, help="0-9, higher first")
    parser.add_argument("--max-attempts", metavar="N", type=positive_int)
    parser.add_argument("--idempotency-key", metavar="K")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--delay", metavar="SECONDS", type=seconds, help="run no sooner than this")
    when.add_argument("--at", metavar="ISO8601", type=timestamp, help="e.g. 2030-01-31T09:00Z")
    parser.add_argument(
        "--custom",
        metavar="KEY=VALUE",
        type=custom_entry,
        action="append",
        default=[],
        help="a custom entry, typed: 5 is an int, 5.0 or 1e3 a float, true/false a bool,"
        " anything else a string (repeatable)",
    )
    parser.add_argument(
        "--custom-str",
        metavar="KEY=VALUE",
        type=custom_str_entry,
        action="append",
        default=[],
        help="a custom entry kept as a string (repeatable)",
    )
    parser.set_defaults(run=run)


def custom_map(entries: Iterable[tuple[str, CustomValue]]) -> dict[str, CustomValue]:
    custom: dict[str, CustomValue] = {}
    for key, value in entries:
        if key in custom:
            raise UsageError(f"custom key {key!r} is given twice")
        custom[key] = value
    return custom


def _payload(args: argparse.Namespace) -> sepp.Payload | None:
    if args.encoding is not None and args.data_file is None:
        raise UsageError("--encoding labels --data-file; it cannot be used without it")
    if args.json is not None:
        try:
            value = strict_json(args.json)
        except ValueError as exc:
            raise UsageError(f"--json: not valid JSON: {exc}") from None
        return sepp.Payload.json(value)
    if args.text is not None:
        return sepp.Payload.text(args.text)
    if args.data_file is not None:
        if args.data_file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.data_file, "rb") as file:
                data = file.read()
        if not data:
            raise UsageError(f"--data-file: {args.data_file} is empty (omit the payload instead)")
        return sepp.Payload.bytes(data, args.encoding or BYTES_ENCODING)
    return None


def request_from_args(args: argparse.Namespace) -> sepp.EnqueueRequest:
    if args.task is not None:
        return _task_request(args)
    if args.queue is None or args.job_type is None:
        missing = "JOB_TYPE" if args.queue is not None else "QUEUE, JOB_TYPE"
        raise UsageError(f"the following arguments are required: {missing} (or --task MODULE:ATTR)")
    return sepp.EnqueueRequest(
        args.queue,
        args.job_type,
        payload=_payload(args),
        idempotency_key=args.idempotency_key,
        priority=args.priority,
        max_attempts=args.max_attempts,
        custom=custom_map([*args.custom, *args.custom_str]),
        scheduled_at=after(args.delay) if args.delay is not None else args.at,
    )


def _task_request(args: argparse.Namespace) -> sepp.EnqueueRequest:
    if args.queue is not None:
        raise UsageError("--task names the queue and job type; omit QUEUE and JOB_TYPE")
    if args.text is not None or args.data_file is not None:
        raise UsageError("--task takes its payload as --json")
    task = load_task(args.task)
    document = None
    if args.json is not None:
        try:
            document = strict_json(args.json)
        except ValueError as exc:
            raise UsageError(f"--json: not valid JSON: {exc}") from None
    try:
        payload = typed_payload(task, document)
    except sepp.PayloadDecodeError as exc:
        raise UsageError(f"--json does not fit task {task.job_type!r}: {exc}") from None
    return task.encoded_request(
        payload,
        idempotency_key=args.idempotency_key,
        priority=args.priority,
        max_attempts=args.max_attempts,
        custom=custom_map([*args.custom, *args.custom_str]) or None,
        scheduled_at=after(args.delay) if args.delay is not None else args.at,
    )


async def run(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    async with open_client(args) as client:
        ack = await client.enqueue(request)
    print(ack.job_id, flush=True)
    if ack.deduplicated:
        note(f"deduplicated: a job with idempotency key {request.idempotency_key!r} exists")
    return EXIT_OK
