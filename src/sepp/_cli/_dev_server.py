"""`sepp-trio dev-server`: a sepp server in memory for local development (no Rust, no
binary): `sepp.testing.MemoryServer` in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import tomllib
from pathlib import Path
from typing import Any

import trio

from ..testing import ConfigError, MemoryServer
from ._failures import EXIT_OK, UsageError
from ._signals import run_until_signalled

log = logging.getLogger("sepp.cli")
DEFAULT_LISTEN = "127.0.0.1:50051"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "dev-server",
        help="run a sepp server in memory, for local development",
        description="Serve the sepp protocol from this process, with every job in memory:"
        " what stops with it is lost (nothing is written to disk). It answers as sepp 0.1.1"
        " does (docs/testing.md lists what differs). --config takes the TOML the real server"
        " reads. SIGINT or SIGTERM stops it as the real server stops: waiting reserves return"
        " empty, connections get GOAWAY. The line 'queue server listening addr=HOST:PORT'"
        " on stderr says it is ready.",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="the server's TOML config (as `sepp --config FILE`)"
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"where to listen (default: the config's server.listen_addr if set, else"
        f" {DEFAULT_LISTEN}; port 0: a free one)",
    )
    parser.set_defaults(run=run, default_log_level="info")


def _listen_address(args: argparse.Namespace, config: dict[str, object]) -> tuple[str, int]:
    server = config.get("server")
    configured = server.get("listen_addr") if isinstance(server, dict) else None
    text = args.listen or (configured if isinstance(configured, str) else DEFAULT_LISTEN)
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not port.isdigit() or int(port) > 65535 or not host:
        raise UsageError(f"--listen: not a HOST:PORT address: {text!r}")
    return host, int(port)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read the sepp config: {exc}") from None


async def run(args: argparse.Namespace) -> int:
    try:
        config = {} if args.config is None else _read_toml(_path(args.config))
        storage = config.setdefault("storage", {})
        if isinstance(storage, dict):  # the binary's default, not sepp.testing's (10 minutes)
            storage.setdefault("dead_letter_retention_ms", 0)
        host, port = _listen_address(args, config)
        server = MemoryServer(config, host=host, port=port)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    stopped = trio.Event()

    def stop(sig: signal.Signals) -> None:
        log.info("%s: stopping the memory server", sig.name)
        stopped.set()

    async def serve() -> None:
        async with server.serving():
            log.info(
                "queue server listening addr=%s db_path=<memory> auth=%s strict_queues=%s"
                " declared_queues=%d",
                server.address,
                "disabled" if server.config.api_keys is None else "enabled",
                "enabled" if server.config.strict_queues else "disabled",
                len(server.config.queues),
            )
            log.info("every job is in memory: stopping the server loses them")
            await stopped.wait()

    await run_until_signalled(serve, [stop])
    log.info("queue server stopped")
    return EXIT_OK


def _path(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise UsageError(f"--config: no such file: {text}")
    return path
