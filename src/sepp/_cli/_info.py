"""`sepp-trio info`: the server's version and limits."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import timedelta

import sepp

from ._connect import open_client
from ._failures import EXIT_OK
from ._output import json_value


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "info",
        help="show the server's version and limits",
        description="Show the server's version, limits and queue-related settings (global"
        " values: per-queue overrides are not advertised).",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def info_fields(info: sepp.ServerInfo) -> dict[str, object]:
    """Every field; durations in seconds, named with `_s`."""
    fields: dict[str, object] = {}
    for field in dataclasses.fields(info):
        value = getattr(info, field.name)
        name = f"{field.name}_s" if isinstance(value, timedelta) else field.name
        fields[name] = json_value(value)
    return fields


def _human(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


async def run(args: argparse.Namespace) -> int:
    async with open_client(args) as client:
        info = await client.get_server_info()
    fields = info_fields(info)
    if args.json:
        print(json.dumps(fields, indent=2))
    else:
        if not info.restricts_encodings:
            fields["allowed_encodings"] = ["(any)"]
        width = max(len(name) for name in fields)
        for name, value in fields.items():
            print(f"{name:<{width}}  {_human(value)}")
    return EXIT_OK
