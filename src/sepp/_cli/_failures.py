"""Exit codes, and the failures a command reports as one line on stderr."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1  # operational: server unreachable, rejected, refused key, I/O
EXIT_USAGE = 2  # the command line itself is wrong
EXIT_INTERRUPTED = 130  # Ctrl-C outside a worker, as shells report it


class CliError(Exception):
    """A failure to report as one line on stderr; exit with `exit_code`."""

    exit_code = EXIT_FAILURE


class UsageError(CliError):
    """The command line names something that cannot work (bad value, missing module)."""

    exit_code = EXIT_USAGE
