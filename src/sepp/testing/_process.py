"""One run of the server binary: started with its config, its output drained into the
server's log, ready once it listens, accepts TCP and catches SIGTERM, and ended (SIGTERM,
then SIGKILL) with its output read to the last line."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import trio

from ._output import LISTENING_MARKER, OutputLog, parse_listening_line, split_host_port
from ._proc_status import catches_sigterm

#: How long ``stop()`` waits after SIGTERM before it sends SIGKILL.
_TERM_GRACE_SECONDS = 10.0
#: How long start() waits for the server to install its SIGTERM handler.
_SIGTERM_HANDLER_GRACE_SECONDS = 2.0
#: Longest partial line kept while waiting for a newline.
_MAX_PARTIAL_LINE = 64 * 1024


class SeppServerStartError(RuntimeError):
    """The ``sepp`` server process did not come up (or died while starting).

    ``output_lines`` holds the server's recent output (stdout and stderr) and
    ``returncode`` its exit status, or ``None`` if it had to be killed.
    """

    def __init__(
        self, message: str, output_lines: list[str], returncode: int | None = None
    ) -> None:
        super().__init__(message)
        self.output_lines = output_lines
        self.returncode = returncode


class ServerProcess:
    """Book-keeping for one run of the server binary."""

    def __init__(self, process: trio.Process, log: OutputLog, first_line: int) -> None:
        self.process = process
        self.first_line = first_line  # the log's first line from this run
        self.listening = trio.Event()
        self.address: str | None = None
        # Where it accepts connections, once wait_until_ready() said so.
        self.host: str | None = None
        self.port: int | None = None
        self.drained = trio.Event()
        self.open_streams = 0
        self.drain_scopes: list[trio.CancelScope] = []
        self._log = log

    @classmethod
    async def spawn(
        cls,
        binary: str,
        config_path: Path,
        env: Mapping[str, str],
        log: OutputLog,
        nursery: trio.Nursery,
    ) -> ServerProcess:
        """Start `binary` with `config_path`; its output is drained into `log` by tasks in
        `nursery`."""
        first_line = log.line_count
        try:
            process = await trio.lowlevel.open_process(
                [binary, "--config", str(config_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env),
                cwd=str(config_path.parent),
            )
        except OSError as exc:
            raise SeppServerStartError(
                f"could not execute the sepp binary {binary!r}: {exc}", []
            ) from exc
        proc = cls(process, log, first_line)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                proc.open_streams += 1
                nursery.start_soon(proc._drain, stream)
        if proc.open_streams == 0:  # pragma: no cover - we always ask for pipes
            proc.drained.set()
        return proc

    def _add_line(self, raw: bytes) -> None:
        line = self._log.add(raw)
        if not self.listening.is_set():
            addr = parse_listening_line(line)
            if addr is not None:
                self.address = addr
                self.listening.set()
        self._log.wake()

    async def _drain(self, stream: trio.abc.ReceiveStream) -> None:
        buffer = b""
        scope = trio.CancelScope()
        self.drain_scopes.append(scope)
        try:
            with scope:
                while True:
                    try:
                        chunk = await stream.receive_some(65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        break
                    if not chunk:
                        break
                    buffer += chunk
                    *complete, buffer = buffer.split(b"\n")
                    for raw in complete:
                        self._add_line(raw)
                    if len(buffer) > _MAX_PARTIAL_LINE:
                        self._add_line(buffer)
                        buffer = b""
        finally:
            if buffer:
                self._add_line(buffer)
            with trio.CancelScope(shield=True):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
            self.open_streams -= 1
            if self.open_streams == 0:
                self.drained.set()

    async def wait_until_ready(self, deadline: float, startup_timeout: float) -> str | None:
        """Wait for the listening line and a TCP connect; return a failure reason or None
        (then `host` and `port` say where it listens)."""
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:

                async def watch_exit() -> None:
                    await self.process.wait()
                    # Let the drain tasks collect the last words before reporting.
                    with trio.move_on_after(2):
                        await self.drained.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch_exit)
                await self.listening.wait()
                assert self.address is not None
                try:
                    host, port = split_host_port(self.address)
                except ValueError:
                    nursery.cancel_scope.cancel()
                    return f"could not parse the listening address {self.address!r}"
                if host in ("0.0.0.0", ""):
                    host = "127.0.0.1"
                elif host == "::":
                    host = "::1"
                while True:
                    try:
                        stream = await trio.open_tcp_stream(host, port)
                    except OSError:
                        await trio.sleep(0.05)
                        continue
                    await stream.aclose()
                    break
                await self._wait_for_sigterm_handler()
                self.host = host
                self.port = port
                nursery.cancel_scope.cancel()
                return None
        if self.process.returncode is not None:
            return f"exited with status {self.process.returncode} before it was ready"
        if self.listening.is_set():
            return (
                f"it logged {self.address!r} but did not accept TCP connections "
                f"within {startup_timeout}s"
            )
        return (
            f"no '{LISTENING_MARKER}' line within {startup_timeout}s "
            "(is RUST_LOG hiding INFO logs?)"
        )

    async def _wait_for_sigterm_handler(self) -> None:
        """Wait briefly until the server catches SIGTERM, so stop() is graceful.

        The server binds (and logs the listening line) before its serve loop
        installs the SIGTERM handler; a SIGTERM in that window kills it
        outright (status -15).  On Linux the handler is visible in
        /proc/PID/status; elsewhere a short pause has to do.  A binary that
        never handles SIGTERM is accepted after the grace period.
        """
        with trio.move_on_after(_SIGTERM_HANDLER_GRACE_SECONDS):
            while True:
                caught = catches_sigterm(self.process.pid)
                if caught is None:
                    await trio.sleep(0.1)
                    return
                if caught:
                    return
                await trio.sleep(0.01)

    async def terminate(self, *, kill: bool) -> None:
        """Signal the process, reap it and let the drain tasks finish (call shielded)."""
        process = self.process
        if process.returncode is None:
            if kill or sys.platform == "win32":
                process.kill()
            else:
                process.send_signal(signal.SIGTERM)
            with trio.move_on_after(_TERM_GRACE_SECONDS):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
        with trio.move_on_after(5):
            await self.drained.wait()
        for scope in self.drain_scopes:
            scope.cancel()
