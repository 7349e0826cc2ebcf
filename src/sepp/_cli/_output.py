"""What commands print: results on stdout, notes and progress on stderr."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from typing import IO

_CLEAR_LINE = "\r\x1b[K"


def note(text: str) -> None:
    """A line for the person at the terminal (stderr), never part of the result."""
    print(text, file=sys.stderr, flush=True)


class Progress:
    """A status line redrawn in place on stderr, only when stderr is a terminal: logs and
    pipes stay free of carriage returns."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = self._stream.isatty()
        self._shown = False

    def update(self, text: str) -> None:
        if self._enabled:
            self._stream.write(_CLEAR_LINE + text)
            self._stream.flush()
            self._shown = True

    def note(self, text: str) -> None:
        """Print a line of its own, above the status line."""
        self.clear()
        self._stream.write(text + "\n")
        self._stream.flush()

    def clear(self) -> None:
        if self._shown:
            self._stream.write(_CLEAR_LINE)
            self._stream.flush()
            self._shown = False


def json_value(value: object) -> object:
    """Our values as JSON: timestamps in ISO 8601, durations in seconds, tuples as lists."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (tuple, list)):
        return [json_value(item) for item in value]
    return value


def json_line(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
