"""The entry point: parse, set up logging, run the command under trio (or asyncio), map
failures to one line on stderr and an exit status."""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import traceback
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import trio

import sepp

from ._connect import API_KEY_ENV
from ._failures import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, CliError
from ._logging import setup_logging
from ._output import note
from ._parser import PROG, build_parser
from ._signals import ignore_pause_signals

if TYPE_CHECKING:
    from .fleet.child import SupervisorLink

# Flags someone might try to pass a secret with. Refused before argparse sees them, whose
# "unrecognized arguments" message would echo the secret back.
_SECRET_FLAG = re.compile(r"--?(?:api[-_]?key|token|password|secret)(?:=.*)?", re.IGNORECASE)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `sepp-trio` with `argv` (default: the process's); returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if any(_SECRET_FLAG.fullmatch(arg) for arg in arguments):
        note(
            f"{PROG}: error: the API key is read only from ${API_KEY_ENV}, never from a flag"
            " (the command line is visible to every user of this machine)"
        )
        return EXIT_USAGE
    try:
        args = build_parser().parse_args(arguments)
    except SystemExit as exc:  # --help and --version (0), usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    label = " ".join([PROG, args.command, *([args.action] if "action" in args else [])])
    if getattr(args, "burst", False) and getattr(args, "processes", 1) > 1:
        note(f"{label}: --burst runs one worker: it cannot be combined with --processes")
        return EXIT_USAGE
    try:
        setup_logging(args)
    except CliError as exc:
        return report_failure(exc, label, debug=args.debug)
    if args.command == "worker":
        ignore_pause_signals()  # until the worker, or its supervisor, catches them
    try:
        # `worker --processes N` (N > 1) or `--reload`: a supervisor, on trio.
        if getattr(args, "processes", 1) > 1 or getattr(args, "reload", False):
            from .fleet.supervisor import supervise

            status: int = trio.run(supervise, args, run_child)
        else:
            status = run_on_loop(getattr(args, "loop", "trio"), args.run, args)
    except BaseException as exc:
        return report_failure(_single(exc), label, debug=args.debug)
    return status


def run_child(args: argparse.Namespace, link: SupervisorLink) -> int:
    """One worker process under `worker --processes N` (spawned: logging is set up again),
    given its link to the supervisor."""
    label = f"{PROG} {args.command} (process {link.index})"
    try:
        setup_logging(args)
        return run_on_loop(args.loop, functools.partial(args.run, link=link), args)
    except BaseException as exc:
        return report_failure(_single(exc), label, debug=args.debug)


def run_on_loop(
    loop: str,
    fn: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
    args: argparse.Namespace,
) -> int:
    """`fn(args)` on trio (every command), or on asyncio or uvloop (`worker --loop`)."""
    if loop == "trio":
        return trio.run(fn, args)
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise CliError("--loop uvloop needs uvloop: pip install uvloop") from None
        return uvloop.run(fn(args))
    import asyncio

    return asyncio.run(fn(args))


def _single(exc: BaseException) -> BaseException:
    # Nurseries wrap errors in exception groups; a group of one is that one error.
    while True:
        inner = getattr(exc, "exceptions", None)
        if not (isinstance(inner, tuple) and len(inner) == 1):
            return exc
        exc = inner[0]


def _silence_stdout() -> None:
    # Python flushes stdout at exit; into a closed pipe that prints its own traceback.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def report_failure(exc: BaseException, label: str, *, debug: bool) -> int:
    """One line on stderr (after the traceback with `debug`); returns the exit status."""
    if isinstance(exc, KeyboardInterrupt):
        note(f"{label}: interrupted")
        return EXIT_INTERRUPTED
    if isinstance(exc, BrokenPipeError) or isinstance(exc.__cause__, BrokenPipeError):
        _silence_stdout()
        if isinstance(exc, BrokenPipeError):
            return EXIT_FAILURE  # the reader left (`| head`): nothing to say
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    if isinstance(exc, CliError):
        status, message = exc.exit_code, str(exc)
    elif isinstance(exc, sepp.ValidationError):
        status, message = EXIT_USAGE, str(exc)
    elif isinstance(exc, sepp.UnauthenticatedError):
        status, message = EXIT_FAILURE, f"{exc} (check ${API_KEY_ENV})"
    elif isinstance(exc, (sepp.SeppError, OSError)):
        status, message = EXIT_FAILURE, str(exc)
    else:
        hint = "" if debug else " (run with --debug for the traceback)"
        status, message = EXIT_FAILURE, f"unexpected {type(exc).__name__}: {exc}{hint}"
    note(f"{label}: {message}")
    return status
