"""`sepp-trio queues`: each queue's depths and dead letters, read from the admin API without
consuming anything."""

from __future__ import annotations

import argparse
from typing import Any

from ._admin import AdminApi, add_admin_options
from ._failures import EXIT_OK, CliError
from ._output import json_line

COLUMNS = ("ready", "scheduled", "inflight", "dead_lettered")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "queues",
        help="each queue's depths and dead letters (admin API; consumes nothing)",
        description="Print each queue's ready, scheduled, in-flight and dead-lettered job"
        " counts, read from the server's admin API: nothing is reserved or drained. The server"
        " refreshes these counts about once a second. Queues with no job and no declaration"
        " are not listed.",
    )
    parser.add_argument("names", metavar="QUEUE", nargs="*", help="only these queues")
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per queue instead of a table"
    )
    add_admin_options(parser)
    parser.set_defaults(run=run)


def depths(entry: dict[str, Any]) -> dict[str, int]:
    found = entry.get("depths") or {}
    return {column: int(found.get(column, 0)) for column in COLUMNS}


def table(rows: list[tuple[str, dict[str, int]]]) -> list[str]:
    header = ("QUEUE", *(column.upper() for column in COLUMNS))
    cells = [header] + [(name, *(str(d[column]) for column in COLUMNS)) for name, d in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    ]


async def run(args: argparse.Namespace) -> int:
    api = AdminApi.from_args(args)
    listed = await api.get("/queues")
    if not isinstance(listed, list):
        raise CliError(f"{api.base_url}: unexpected answer to /queues: {listed!r:.200}")
    by_name = {str(entry.get("name")): entry for entry in listed if isinstance(entry, dict)}
    names = args.names or sorted(by_name)
    rows = [(name, depths(by_name.get(name, {}))) for name in names]
    if args.json:
        for name, counts in rows:
            declared = bool(by_name.get(name, {}).get("declared", False))
            print(json_line({"queue": name, **counts, "declared": declared}))
    else:
        for line in table(rows):
            print(line)
    return EXIT_OK
