"""Launch a real ``sepp`` server process from trio code (see :mod:`sepp.testing`)."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from ._config_schema import config_problem
from ._toml import dumps as toml_dumps

SEPP_SERVER_VERSION = "0.1.1"
"""The sepp server release this client is tested against."""

INSTALL_COMMAND = f"cargo install sepp --version {SEPP_SERVER_VERSION} --locked"
"""The command that installs the pinned server (add ``--root DIR`` to choose where)."""

DEAD_LETTER_RETENTION_MS = 600_000
"""How long a test server keeps dead letters (10 minutes) unless its config says otherwise: a
test of dead letters drains them, and the real server's default (0) keeps none."""

#: How many recent output lines (stdout and stderr together) a server keeps.
OUTPUT_LINES_KEPT = 200
#: How many of those lines go into an exception message.
_MESSAGE_TAIL_LINES = 60
#: How long ``stop()`` waits after SIGTERM before it sends SIGKILL.
_TERM_GRACE_SECONDS = 10.0
#: How long ``start()`` keeps retrying when the pinned port is briefly busy.
_PORT_BUSY_RETRY_SECONDS = 10.0
#: How long start() waits for the server to install its SIGTERM handler.
_SIGTERM_HANDLER_GRACE_SECONDS = 2.0
#: Longest partial line kept while waiting for a newline.
_MAX_PARTIAL_LINE = 64 * 1024

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_LISTENING_MARKER = "queue server listening"
_TEXT_ADDR = re.compile(r"\baddr=(\S+)")
_JSON_ADDR = re.compile(r'"addr"\s*:\s*"([^"]+)"')
_PORT_BUSY = re.compile(r"address already in use|addrinuse|os error 98|os error 48", re.I)
# Config overrides inherited from the caller's environment would make tests
# depend on the shell they run in; they are dropped (pass ``env=`` instead).
_INHERITED_OVERRIDE = re.compile(r"SEPP_[A-Z0-9_]+__[A-Z0-9_]+", re.I)


class SeppServerNotFound(RuntimeError):
    """No usable ``sepp`` server binary could be found."""


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


def _cache_root() -> Path:
    configured = os.environ.get("SEPP_TRIO_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "sepp-trio"


def sepp_cache_binary_path() -> Path:
    """Where the pinned server is looked for after ``SEPP_BIN``:
    ``${SEPP_TRIO_CACHE:-~/.cache/sepp-trio}/sepp-<version>/bin/sepp``, where
    ``cargo install sepp --version <version> --locked --root <that bin's parent>`` puts it
    (as sepp-trio's own ``scripts/ensure-sepp-server.sh`` does in a checkout).
    """
    exe = "sepp.exe" if sys.platform == "win32" else "sepp"
    return _cache_root() / f"sepp-{SEPP_SERVER_VERSION}" / "bin" / exe


def _is_executable_file(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _not_found_message(reason: str) -> str:
    """What to do, in steps a pip user can take: cargo, or SEPP_BIN; the repository's script
    only when this package runs from a checkout that has it."""
    root = sepp_cache_binary_path().parent.parent
    steps = [
        f"install it with cargo (Rust's package manager: https://rustup.rs) where it is looked"
        f" for:\n      {INSTALL_COMMAND} --root {root}\n"
        f"    (or plain `{INSTALL_COMMAND}` to put it on PATH)",
        "point SEPP_BIN at a sepp binary you have: SEPP_BIN=/path/to/sepp",
    ]
    script = _repository_script()
    if script is not None:
        steps.append(f"in this checkout, run {script} (it builds the server into {root})")
    return (
        f"{reason}\nThe sepp server {SEPP_SERVER_VERSION} is needed to run these tests."
        " Either:\n" + ", or\n".join(f"  * {step}" for step in steps) + "."
    )


def _repository_script(module: str = __file__) -> Path | None:
    """sepp-trio's own `scripts/ensure-sepp-server.sh`, when this package is imported from a
    source checkout (src/sepp/testing/, an editable install) that has it; a wheel has none."""
    script = Path(module).resolve().parents[3] / "scripts" / "ensure-sepp-server.sh"
    return script if script.is_file() else None


def find_sepp_binary() -> str:
    """Return the path of the ``sepp`` server binary to launch.

    Looked up in this order:

    1. the ``SEPP_BIN`` environment variable (it must name an executable file;
       a wrong value is an error, not silently skipped);
    2. the cache, :func:`sepp_cache_binary_path`:
       ``${SEPP_TRIO_CACHE:-~/.cache/sepp-trio}/sepp-0.1.1/bin/sepp``;
    3. ``sepp`` on ``PATH``.

    Raises :class:`SeppServerNotFound` (with the install command and ``SEPP_BIN`` in the
    message) if none of these yields a binary.
    """
    configured = os.environ.get("SEPP_BIN")
    if configured:
        if _is_executable_file(configured):
            return configured
        raise SeppServerNotFound(
            _not_found_message(f"SEPP_BIN={configured!r} is not an executable file.")
        )
    cached = sepp_cache_binary_path()
    if _is_executable_file(cached):
        return str(cached)
    on_path = shutil.which("sepp")
    if on_path:
        return on_path
    raise SeppServerNotFound(
        _not_found_message(
            f"No sepp server binary: SEPP_BIN is not set, {cached} does not exist "
            "and there is no `sepp` on PATH."
        )
    )


def _resolve_binary(binary: str | os.PathLike[str]) -> str:
    text = os.fspath(binary)
    if os.sep not in text and (os.altsep is None or os.altsep not in text):
        found = shutil.which(text)
        if found is None:
            raise SeppServerNotFound(_not_found_message(f"{text!r} was not found on PATH."))
        return found
    if not os.path.exists(text):
        raise SeppServerNotFound(_not_found_message(f"The sepp binary {text!r} does not exist."))
    if not _is_executable_file(text):
        raise SeppServerNotFound(
            _not_found_message(f"The sepp binary {text!r} is not an executable file.")
        )
    return text


def _split_host_port(address: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port`` into ``(host, port)`` (host without brackets)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_listening_line(line: str) -> str | None:
    """Return the bound address from a ``queue server listening`` log line, if it is one."""
    if _LISTENING_MARKER not in line:
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


def _catches_sigterm(pid: int) -> bool | None:
    """Whether process ``pid`` has a SIGTERM handler (``None``: cannot tell here)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except (OSError, ValueError, IndexError):
        return None
    return None


def _write_config_file(path: Path, config: Mapping[str, object]) -> None:
    """Write ``config`` as TOML to ``path`` atomically (the server watches it)."""
    text = toml_dumps(config)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _with_test_defaults(config: Mapping[str, object] | None) -> dict[str, object]:
    """`config` (copied) with what a test server has unless it says otherwise:
    `storage.dead_letter_retention_ms` = DEAD_LETTER_RETENTION_MS. A `storage` that is not a
    table is left for the config check to refuse."""
    config = dict(config or {})
    storage = config.get("storage", {})
    if isinstance(storage, Mapping) and "dead_letter_retention_ms" not in storage:
        config["storage"] = {**storage, "dead_letter_retention_ms": DEAD_LETTER_RETENTION_MS}
    return config


def _config_sets_admin_enabled(config: Mapping[str, object]) -> bool:
    admin = config.get("admin")
    return isinstance(admin, Mapping) and admin.get("enabled") is not None


class _Process:
    """Book-keeping for one run of the server binary."""

    def __init__(self, process: trio.Process, first_line: int) -> None:
        self.process = process
        self.first_line = first_line
        self.listening = trio.Event()
        self.address: str | None = None
        self.drained = trio.Event()
        self.open_streams = 0
        self.drain_scopes: list[trio.CancelScope] = []


class SeppServer:
    """A ``sepp`` server process run by :func:`sepp_server`.

    Do not construct this yourself; use the :func:`sepp_server` context
    manager (or the ``sepp_server`` pytest fixture), which owns the nursery the
    output-draining tasks run in.

    Attributes:
        host: the loopback host the server listens on (``"127.0.0.1"``).
        port: the TCP port, chosen by the OS on the first start and reused by
            :meth:`start` / :meth:`restart`.
        data_dir: the server's ``db_path`` (a fresh temp dir unless given).
        config_path: the TOML file passed with ``--config``; the server
            hot-reloads it (see :meth:`update_config`).
    """

    def __init__(
        self,
        *,
        binary: str,
        config: Mapping[str, object],
        config_path: Path,
        data_dir: Path,
        env: Mapping[str, str] | None,
        startup_timeout: float,
        nursery: trio.Nursery,
        check_config: bool = True,
    ) -> None:
        self.binary = binary
        self._check_config = check_config
        self.config_path = config_path
        self.data_dir = data_dir
        self.host = "127.0.0.1"
        self.startup_timeout = startup_timeout
        self._config: dict[str, object] = dict(config)
        self._extra_env: dict[str, str] = dict(env or {})
        self._nursery = nursery
        self._port: int | None = None
        self._proc: _Process | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=OUTPUT_LINES_KEPT)
        self._line_count = 0
        self._new_output = trio.Event()
        self._closed = False

    # ------------------------------------------------------------------ info

    @property
    def port(self) -> int:
        """The server's TCP port (fixed after the first successful start)."""
        if self._port is None:
            raise RuntimeError("the sepp server has not been started yet")
        return self._port

    @property
    def address(self) -> str:
        """``"127.0.0.1:PORT"``: what a client should connect to."""
        return _join_host_port(self.host, self.port)

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.process.returncode is None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last server process (``None`` while running or never run)."""
        return None if self._proc is None else self._proc.process.returncode

    @property
    def pid(self) -> int | None:
        """Process id of the current (or last) server process."""
        return None if self._proc is None else self._proc.process.pid

    @property
    def config(self) -> dict[str, object]:
        """A copy of the config last written to :attr:`config_path`."""
        return dict(self._config)

    @property
    def output_lines(self) -> list[str]:
        """The last ~200 lines the server wrote (stdout and stderr, ANSI codes removed)."""
        return list(self._lines)

    @property
    def output_line_count(self) -> int:
        """Total number of lines seen so far; pass it as ``after=`` to :meth:`wait_for_output`."""
        return self._line_count

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        port = self._port if self._port is not None else "?"
        return f"<SeppServer {self.host}:{port} {state} data_dir={str(self.data_dir)!r}>"

    # ------------------------------------------------------------ lifecycle

    def update_config(self, config: Mapping[str, object] | None) -> None:
        """Rewrite the config file (atomically) with ``config``.

        The running server notices the change and hot-reloads it after a
        ~500 ms debounce; it logs ``configuration reloaded`` on success and
        ``config reload failed`` (keeping the old config) on an invalid one.
        Restart-only keys (``server.*``, ``storage.*``,
        ``limits.max_message_bytes``) need :meth:`restart`.  Dead letters are
        kept for 10 minutes unless ``config`` sets
        ``storage.dead_letter_retention_ms``, as in :func:`sepp_server`.  An unknown key
        or a value of the wrong type raises ``ValueError`` and writes nothing
        (unless the server was started with ``check_config=False``).  To wait for the
        reload::

            mark = server.output_line_count
            server.update_config(new)
            with trio.fail_after(10):
                await server.wait_for_output("configuration reloaded", after=mark)
        """
        new = _with_test_defaults(config)
        problem = config_problem(new) if self._check_config else None
        if problem is not None:
            raise ValueError(f"{problem} (sepp {SEPP_SERVER_VERSION})")
        self._config = new
        _write_config_file(self.config_path, self._config)

    async def wait_for_output(self, pattern: str | re.Pattern[str], *, after: int = 0) -> str:
        """Wait until the server prints a line matching ``pattern`` (``re.search``).

        Only lines numbered ``after`` or later (see :attr:`output_line_count`)
        count, so a mark taken before an action ignores older output.  Returns
        the matching line.  It waits forever: bound it with ``trio.fail_after``.
        Lines that have already scrolled out of the ~200-line buffer are not seen.
        """
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        while True:
            first_kept = self._line_count - len(self._lines)
            for index, line in enumerate(self._lines, start=first_kept):
                if index >= after and regex.search(line):
                    return line
            await self._new_output.wait()

    async def start(self) -> None:
        """Start the server process and wait until it accepts TCP connections.

        The first start lets the OS pick a free port; later starts (after
        :meth:`stop`) reuse the same port and the same data dir, retrying for a
        few seconds if the port is briefly busy.  Raises
        :class:`SeppServerStartError` (with the server's output) on failure.
        """
        if self._closed:
            raise RuntimeError("this SeppServer's context has exited")
        if self.running:
            raise RuntimeError("the sepp server is already running")
        deadline = trio.current_time() + self.startup_timeout
        busy_deadline = min(deadline, trio.current_time() + _PORT_BUSY_RETRY_SECONDS)
        busy: SeppServerStartError | None = None
        while True:
            try:
                await self._start_once(deadline)
                return
            except SeppServerStartError as exc:
                port_busy = (
                    self._port is not None
                    and exc.returncode is not None
                    and any(_PORT_BUSY.search(line) for line in exc.output_lines)
                )
                if port_busy:
                    busy = exc
                elif busy is not None and exc.returncode is None:
                    # The deadline cut a retry short: the busy port is why it never started.
                    raise busy from None
                if not port_busy or trio.current_time() + 0.25 >= busy_deadline:
                    raise
            await trio.sleep(0.25)

    async def stop(self, *, kill: bool = False) -> None:
        """Stop the server and wait for it to exit.

        Sends SIGTERM (graceful: in-flight calls finish, waiting reserves
        return empty) or, with ``kill=True``, SIGKILL (a crash: nothing is
        flushed).  After SIGTERM it waits up to 10 s, then SIGKILLs.  Does
        nothing if the server is not running.  The wait is shielded from
        cancellation so the process is never left behind.
        """
        proc = self._proc
        if proc is None:
            return
        with trio.CancelScope(shield=True):
            await self._terminate(proc, kill=kill)

    async def restart(self, *, kill: bool = False) -> None:
        """:meth:`stop` (``kill`` as there) then :meth:`start` on the same port and data dir."""
        await self.stop(kill=kill)
        await self.start()

    # ------------------------------------------------------------- internals

    def _child_env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if key != "SEPP_CONFIG" and not _INHERITED_OVERRIDE.fullmatch(key)
        }
        port = self._port if self._port is not None else 0
        env["SEPP_SERVER__LISTEN_ADDR"] = _join_host_port(self.host, port)
        env["SEPP_SERVER__DB_PATH"] = str(self.data_dir)
        if not _config_sets_admin_enabled(self._config):
            env["SEPP_ADMIN__ENABLED"] = "false"
        # If admin is switched on, a fixed port would clash between servers.
        env["SEPP_ADMIN__LISTEN_ADDR"] = "127.0.0.1:0"
        env["RUST_LOG"] = "sepp=info"
        env["NO_COLOR"] = "1"
        env.update(self._extra_env)
        return env

    def _tail_message(self, since: int = 0) -> str:
        lines = self._lines_since(since)
        if not lines:
            return "\n(the server printed nothing)"
        lines = lines[-_MESSAGE_TAIL_LINES:]
        return "\nserver output (last lines):\n" + "\n".join(f"  | {line}" for line in lines)

    def _add_line(self, raw: bytes, proc: _Process) -> None:
        line = _ANSI_ESCAPE.sub("", raw.decode("utf-8", errors="replace")).rstrip("\r\n")
        self._lines.append(line)
        self._line_count += 1
        if not proc.listening.is_set():
            addr = _parse_listening_line(line)
            if addr is not None:
                proc.address = addr
                proc.listening.set()
        self._new_output.set()
        self._new_output = trio.Event()

    async def _drain(self, stream: trio.abc.ReceiveStream, proc: _Process) -> None:
        buffer = b""
        scope = trio.CancelScope()
        proc.drain_scopes.append(scope)
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
                        self._add_line(raw, proc)
                    if len(buffer) > _MAX_PARTIAL_LINE:
                        self._add_line(buffer, proc)
                        buffer = b""
        finally:
            if buffer:
                self._add_line(buffer, proc)
            with trio.CancelScope(shield=True):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
            proc.open_streams -= 1
            if proc.open_streams == 0:
                proc.drained.set()

    async def _start_once(self, deadline: float) -> None:
        _write_config_file(self.config_path, self._config)
        first_line = self._line_count
        try:
            process = await trio.lowlevel.open_process(
                [self.binary, "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._child_env(),
                cwd=str(self.config_path.parent),
            )
        except OSError as exc:
            raise SeppServerStartError(
                f"could not execute the sepp binary {self.binary!r}: {exc}", []
            ) from exc
        proc = _Process(process, first_line)
        self._proc = proc
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                proc.open_streams += 1
                self._nursery.start_soon(self._drain, stream, proc)
        if proc.open_streams == 0:  # pragma: no cover - we always ask for pipes
            proc.drained.set()

        failure: str | None = None
        try:
            failure = await self._wait_until_ready(proc, deadline)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._terminate(proc, kill=True)
            raise
        if failure is None:
            return
        with trio.CancelScope(shield=True):
            await self._terminate(proc, kill=True)
        returncode = process.returncode if failure.startswith("exited") else None
        raise SeppServerStartError(
            f"the sepp server ({self.binary}) failed to start: {failure}"
            + self._tail_message(first_line),
            self._lines_since(first_line),
            returncode,
        )

    def _lines_since(self, since: int) -> list[str]:
        first_kept = self._line_count - len(self._lines)
        return [line for index, line in enumerate(self._lines, start=first_kept) if index >= since]

    async def _wait_until_ready(self, proc: _Process, deadline: float) -> str | None:
        """Wait for the listening line and a TCP connect; return a failure reason or None."""
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:

                async def watch_exit() -> None:
                    await proc.process.wait()
                    # Let the drain tasks collect the last words before reporting.
                    with trio.move_on_after(2):
                        await proc.drained.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch_exit)
                await proc.listening.wait()
                assert proc.address is not None
                try:
                    host, port = _split_host_port(proc.address)
                except ValueError:
                    nursery.cancel_scope.cancel()
                    return f"could not parse the listening address {proc.address!r}"
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
                await self._wait_for_sigterm_handler(proc)
                self.host = host
                self._port = port
                nursery.cancel_scope.cancel()
                return None
        if proc.process.returncode is not None:
            return f"exited with status {proc.process.returncode} before it was ready"
        if proc.listening.is_set():
            return (
                f"it logged {proc.address!r} but did not accept TCP connections "
                f"within {self.startup_timeout}s"
            )
        return (
            f"no '{_LISTENING_MARKER}' line within {self.startup_timeout}s "
            "(is RUST_LOG hiding INFO logs?)"
        )

    async def _wait_for_sigterm_handler(self, proc: _Process) -> None:
        """Wait briefly until the server catches SIGTERM, so stop() is graceful.

        The server binds (and logs the listening line) before its serve loop
        installs the SIGTERM handler; a SIGTERM in that window kills it
        outright (status -15).  On Linux the handler is visible in
        /proc/PID/status; elsewhere a short pause has to do.  A binary that
        never handles SIGTERM is accepted after the grace period.
        """
        with trio.move_on_after(_SIGTERM_HANDLER_GRACE_SECONDS):
            while True:
                caught = _catches_sigterm(proc.process.pid)
                if caught is None:
                    await trio.sleep(0.1)
                    return
                if caught:
                    return
                await trio.sleep(0.01)

    async def _terminate(self, proc: _Process, *, kill: bool) -> None:
        """Signal the process, reap it and let the drain tasks finish (call shielded)."""
        process = proc.process
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
            await proc.drained.wait()
        for scope in proc.drain_scopes:
            scope.cancel()

    async def _close(self) -> None:
        self._closed = True
        await self.stop()


def _make_workdir(data_dir: str | os.PathLike[str] | None) -> tuple[Path, Path, Path]:
    """Create the temp dir; return it, the config file path and the data dir path."""
    workdir = Path(tempfile.mkdtemp(prefix="sepp-test-"))
    # The config file sits alone in its directory: the server watches the
    # file's parent directory for hot reload.
    config_dir = workdir / "config"
    config_dir.mkdir()
    data_path = Path(data_dir).resolve() if data_dir is not None else workdir / "data"
    return workdir, config_dir / "sepp.toml", data_path


@asynccontextmanager
async def sepp_server(
    config: Mapping[str, object] | None = None,
    *,
    binary: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 30.0,
    data_dir: str | os.PathLike[str] | None = None,
    check_config: bool = True,
) -> AsyncIterator[SeppServer]:
    """Run a real ``sepp`` server on loopback for the duration of the block.

    ``config`` is written as TOML (see :mod:`sepp.testing._toml` for the
    supported shapes) and passed with ``--config``, with dead letters kept
    for 10 minutes (``storage.dead_letter_retention_ms`` =
    :data:`DEAD_LETTER_RETENTION_MS`) unless it sets that key (0: none, the
    real server's default); :meth:`SeppServer.update_config` keeps the same
    default.  The process also gets these environment variables, which take
    precedence over the file:

    * ``SEPP_SERVER__LISTEN_ADDR=127.0.0.1:0`` (the OS picks the port; a
      restart pins the port it got first),
    * ``SEPP_SERVER__DB_PATH=<data dir>`` (a fresh temp dir unless
      ``data_dir`` is given; a given dir is left in place afterwards),
    * ``SEPP_ADMIN__ENABLED=false`` unless ``config`` sets ``admin.enabled``,
      and ``SEPP_ADMIN__LISTEN_ADDR=127.0.0.1:0``,
    * ``RUST_LOG=sepp=info`` (the readiness line is an INFO log) and ``NO_COLOR=1``,
    * then everything in ``env``, which overrides all of the above.

    ``SEPP_<SECTION>__<FIELD>`` overrides and ``SEPP_CONFIG`` inherited from
    the calling environment are dropped so that the shell cannot change
    what a test runs against.

    The block is entered once the server has logged ``queue server
    listening addr=...`` and a TCP connect to that port succeeded.  On exit
    the server gets SIGTERM (SIGKILL after 10 s), the output-draining tasks
    (which run in a nursery this context manager owns) finish, and the temp
    dirs are removed.

    ``config`` is checked first against the keys and value types that the
    tested server version (:data:`SEPP_SERVER_VERSION`) reads: the server
    itself ignores a misspelled key and reports a wrong type as a raw
    deserialiser dump, so an unknown key or a wrong type raises
    :class:`SeppServerStartError` naming the key and what it expects, before
    the server starts.  ``check_config=False`` skips that (for a newer
    server with keys this version does not know).

    ``binary`` defaults to :func:`find_sepp_binary`.  Raises
    :class:`SeppServerNotFound` if there is no binary, and
    :class:`SeppServerStartError` (with the server's output) if it does not
    come up within ``startup_timeout`` seconds.
    """
    config = _with_test_defaults(config)
    problem = config_problem(config) if check_config else None
    if problem is not None:
        raise SeppServerStartError(
            f"{problem} (sepp {SEPP_SERVER_VERSION}; check_config=False skips this check)", []
        )
    resolved = find_sepp_binary() if binary is None else _resolve_binary(binary)
    workdir, config_path, data_path = _make_workdir(data_dir)
    try:
        caught: BaseException | None = None
        async with trio.open_nursery() as nursery:
            server = SeppServer(
                binary=resolved,
                config=config,
                config_path=config_path,
                data_dir=data_path,
                env=env,
                startup_timeout=startup_timeout,
                nursery=nursery,
                check_config=check_config,
            )
            # Exceptions are carried out of the nursery by hand so callers see
            # them as raised, not wrapped in an ExceptionGroup.
            try:
                await server.start()
                yield server
            except BaseException as exc:
                caught = exc
            finally:
                with trio.CancelScope(shield=True):
                    await server._close()
                nursery.cancel_scope.cancel()
        if caught is not None:
            raise caught
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class ExternalSeppServer:
    """Stands in for :class:`SeppServer` when tests use an already-running server.

    The pytest fixture yields one of these when ``SEPP_TEST_ADDR`` is set.
    It has ``address``, ``host`` and ``port`` but no process: :meth:`start`,
    :meth:`stop`, :meth:`restart` and :meth:`update_config` raise
    ``NotImplementedError``; ``data_dir`` and ``config_path`` are ``None``.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self.host, self.port = _split_host_port(address)
        self.data_dir: Path | None = None
        self.config_path: Path | None = None
        self.output_lines: list[str] = []

    @property
    def running(self) -> bool:
        """Always ``True``: the external server is assumed to be up."""
        return True

    def __repr__(self) -> str:
        return f"<ExternalSeppServer {self.address}>"

    def _unsupported(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"{what} is not supported for an external sepp server ({self.address}, from "
            "SEPP_TEST_ADDR); unset SEPP_TEST_ADDR to let the tests launch their own server"
        )

    async def start(self) -> None:
        """Unsupported: raises ``NotImplementedError``."""
        raise self._unsupported("start()")

    async def stop(self, *, kill: bool = False) -> None:
        """Unsupported: raises ``NotImplementedError``."""
        raise self._unsupported("stop()")

    async def restart(self, *, kill: bool = False) -> None:
        """Unsupported: raises ``NotImplementedError``."""
        raise self._unsupported("restart()")

    def update_config(self, config: Mapping[str, object] | None) -> None:
        """Unsupported: raises ``NotImplementedError``."""
        raise self._unsupported("update_config()")
