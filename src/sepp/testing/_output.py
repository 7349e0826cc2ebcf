"""What the server prints: its recent lines, kept across restarts for error messages and
waits, and what they tell (the address it listens on, a busy port)."""

from __future__ import annotations

import collections
import json
import re

import trio

#: How many recent output lines (stdout and stderr together) a server keeps.
OUTPUT_LINES_KEPT = 200
#: How many of those lines go into an exception message.
_MESSAGE_TAIL_LINES = 60

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
LISTENING_MARKER = "queue server listening"
_TEXT_ADDR = re.compile(r"\baddr=(\S+)")
_JSON_ADDR = re.compile(r'"addr"\s*:\s*"([^"]+)"')
PORT_BUSY = re.compile(r"address already in use|addrinuse|os error 98|os error 48", re.I)


def split_host_port(address: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port`` into ``(host, port)`` (host without brackets)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_listening_line(line: str) -> str | None:
    """Return the bound address from a ``queue server listening`` log line, if it is one."""
    if LISTENING_MARKER not in line:
        return None
    match = _JSON_ADDR.search(line) or _TEXT_ADDR.search(line)
    if match is None:
        # JSON logs could nest the fields; fall back to a real parse.
        try:
            record = json.loads(line)
        except ValueError:
            return None
        fields = record.get("fields", record) if isinstance(record, dict) else None
        addr = fields.get("addr") if isinstance(fields, dict) else None
        return addr if isinstance(addr, str) else None
    return match.group(1).strip("\"',")


class OutputLog:
    """The last OUTPUT_LINES_KEPT lines a server printed (ANSI codes removed), numbered from
    its first start on."""

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=OUTPUT_LINES_KEPT)
        self.line_count = 0
        self._new_output = trio.Event()

    @property
    def lines(self) -> list[str]:
        return list(self._lines)

    def add(self, raw: bytes) -> str:
        """Keep one line the server printed (without its line end); returns it as kept."""
        line = _ANSI_ESCAPE.sub("", raw.decode("utf-8", errors="replace")).rstrip("\r\n")
        self._lines.append(line)
        self.line_count += 1
        return line

    def wake(self) -> None:
        """Wake the waits for a new line (after the line's meaning was taken in)."""
        self._new_output.set()
        self._new_output = trio.Event()

    async def wait_for(self, regex: re.Pattern[str], after: int) -> str:
        """The first kept line numbered `after` or later that matches, as it arrives."""
        while True:
            first_kept = self.line_count - len(self._lines)
            for index, line in enumerate(self._lines, start=first_kept):
                if index >= after and regex.search(line):
                    return line
            await self._new_output.wait()

    def lines_since(self, since: int) -> list[str]:
        first_kept = self.line_count - len(self._lines)
        return [line for index, line in enumerate(self._lines, start=first_kept) if index >= since]

    def tail_message(self, since: int = 0) -> str:
        lines = self.lines_since(since)
        if not lines:
            return "\n(the server printed nothing)"
        lines = lines[-_MESSAGE_TAIL_LINES:]
        return "\nserver output (last lines):\n" + "\n".join(f"  | {line}" for line in lines)
