"""Launch a real ``sepp`` server process from trio code (see :mod:`sepp.testing`): the
`SeppServer` a test holds (its port, config and output across restarts), `sepp_server()`
that runs one, and `ExternalSeppServer`. The parts live beside it: finding the binary
(`_binary`), the server's output (`_output`), its config file and environment
(`_config_file`), the /proc probe (`_proc_status`) and one run of the process (`_process`)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from ._binary import SEPP_SERVER_VERSION, find_sepp_binary, resolve_binary
from ._config_file import make_workdir, server_env, write_config_file
from ._config_schema import config_problem
from ._output import PORT_BUSY, OutputLog, join_host_port, split_host_port
from ._process import SeppServerStartError, ServerProcess

DEAD_LETTER_RETENTION_MS = 600_000
"""How long a test server keeps dead letters (10 minutes) unless its config says otherwise: a
test of dead letters drains them, and the real server's default (0) keeps none."""

#: How long ``start()`` keeps retrying when the pinned port is briefly busy.
_PORT_BUSY_RETRY_SECONDS = 10.0


def _with_test_defaults(config: Mapping[str, object] | None) -> dict[str, object]:
    """`config` (copied) with what a test server has unless it says otherwise:
    `storage.dead_letter_retention_ms` = DEAD_LETTER_RETENTION_MS. A `storage` that is not a
    table is left for the config check to refuse."""
    config = dict(config or {})
    storage = config.get("storage", {})
    if isinstance(storage, Mapping) and "dead_letter_retention_ms" not in storage:
        config["storage"] = {**storage, "dead_letter_retention_ms": DEAD_LETTER_RETENTION_MS}
    return config


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
        self._proc: ServerProcess | None = None
        self._log = OutputLog()
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
        return join_host_port(self.host, self.port)

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
        return self._log.lines

    @property
    def output_line_count(self) -> int:
        """Total number of lines seen so far; pass it as ``after=`` to :meth:`wait_for_output`."""
        return self._log.line_count

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
        write_config_file(self.config_path, self._config)

    async def wait_for_output(self, pattern: str | re.Pattern[str], *, after: int = 0) -> str:
        """Wait until the server prints a line matching ``pattern`` (``re.search``).

        Only lines numbered ``after`` or later (see :attr:`output_line_count`)
        count, so a mark taken before an action ignores older output.  Returns
        the matching line.  It waits forever: bound it with ``trio.fail_after``.
        Lines that have already scrolled out of the ~200-line buffer are not seen.
        """
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        return await self._log.wait_for(regex, after)

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
                    and any(PORT_BUSY.search(line) for line in exc.output_lines)
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
            await proc.terminate(kill=kill)

    async def restart(self, *, kill: bool = False) -> None:
        """:meth:`stop` (``kill`` as there) then :meth:`start` on the same port and data dir."""
        await self.stop(kill=kill)
        await self.start()

    # ------------------------------------------------------------- internals

    async def _start_once(self, deadline: float) -> None:
        write_config_file(self.config_path, self._config)
        env = server_env(
            host=self.host,
            port=self._port,
            data_dir=self.data_dir,
            config=self._config,
            extra_env=self._extra_env,
        )
        proc = await ServerProcess.spawn(
            self.binary, self.config_path, env, self._log, self._nursery
        )
        self._proc = proc
        failure: str | None = None
        try:
            failure = await proc.wait_until_ready(deadline, self.startup_timeout)
        except BaseException:
            with trio.CancelScope(shield=True):
                await proc.terminate(kill=True)
            raise
        if failure is None:
            assert proc.host is not None and proc.port is not None
            self.host = proc.host
            self._port = proc.port
            return
        with trio.CancelScope(shield=True):
            await proc.terminate(kill=True)
        returncode = proc.process.returncode if failure.startswith("exited") else None
        raise SeppServerStartError(
            f"the sepp server ({self.binary}) failed to start: {failure}"
            + self._log.tail_message(proc.first_line),
            self._log.lines_since(proc.first_line),
            returncode,
        )

    async def _close(self) -> None:
        self._closed = True
        await self.stop()


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
    resolved = find_sepp_binary() if binary is None else resolve_binary(binary)
    workdir, config_path, data_path = make_workdir(data_dir)
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
        self.host, self.port = split_host_port(address)
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
