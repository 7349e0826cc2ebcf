"""The argument parser: global options, then one subcommand per module."""

from __future__ import annotations

import argparse
from typing import Any

from .._version import __version__
from . import (
    _dead_letters,
    _dev_server,
    _enqueue,
    _enqueue_file,
    _info,
    _outbox_command,
    _queues,
    _scheduler_command,
    _worker_command,
)
from ._connect import add_connection_options
from ._logging import LOG_FORMATS

PROG = "sepp-trio"
LOG_LEVELS = ("debug", "info", "warning", "error")

# Each module adds its subparser and sets `run` (an async function of the parsed arguments
# returning the exit status). The two services (worker, scheduler) share _targets.load_target
# and _signals.run_until_signalled.
_COMMANDS = (
    _info,
    _queues,
    _enqueue,
    _enqueue_file,
    _dead_letters,
    _worker_command,
    _scheduler_command,
    _outbox_command,
    _dev_server,
)


class _Parser(argparse.ArgumentParser):
    """No abbreviated options (`--a` never guesses): scripts keep working as options are
    added. Subcommand parsers are of the same class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


class _CommandParser(_Parser):
    """A subcommand's parser: it takes the global options too, so that
    `sepp-trio worker app:router --queue q --log-format json` works as well as
    `sepp-trio --log-format json worker ...`. Their defaults are the main parser's (here
    SUPPRESS: an option left out after the command keeps the value given before it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_global_options(self, after_command=True)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Operate a sepp job queue server and run workers and schedulers from the"
        " shell. The options below may also come after the command.",
        epilog="Exit status: 0 success, 1 operational failure (server unreachable, rejected,"
        " refused key), 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_global_options(parser, after_command=False)
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_CommandParser
    )
    for command in _COMMANDS:
        command.add_parser(commands)
    return parser


def _add_global_options(parser: argparse.ArgumentParser, *, after_command: bool) -> None:
    add_connection_options(parser, after_command=after_command)
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if after_command else {}
    output = parser.add_argument_group("output")
    output.add_argument(
        "--log-level",
        metavar="LEVEL",
        choices=LOG_LEVELS,
        help=f"{', '.join(LOG_LEVELS)} (default: info for worker, scheduler, outbox"
        " relay and dev-server, else warning); logs go to stderr",
        **default,
    )
    output.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="text (the default) or json: one JSON object per line",
        **default,
    )
    output.add_argument(
        "--log-config",
        metavar="FILE",
        help="configure logging from FILE instead: logging.config.dictConfig from a .json"
        " file, fileConfig from anything else (INI)",
        **default,
    )
    output.add_argument(
        "--debug", action="store_true", help="show the traceback of a failure", **default
    )
