"""Connection options: flags for the address and TLS, `$SEPP_API_KEY` for the key."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import sepp

from .._model.backoff import backoff_delay
from .._runtime import concurrency
from ._values import positive_seconds

T = TypeVar("T")
log = logging.getLogger("sepp.cli")

ADDRESS_ENV = "SEPP_ADDR"
API_KEY_ENV = "SEPP_API_KEY"
DEFAULT_ADDRESS = "127.0.0.1:50051"
# Waiting for the server (not up yet, or refusing the key): 1 s doubling to 30 s, each sleep
# drawn from [0.5, 1.0) of the step, as the Scheduler retries its enqueues.
RETRY_INITIAL_S = 1.0
RETRY_CAP_S = 30.0


def retry_delay(failures: int) -> float:
    """The sleep after `failures` failed tries in a row to reach the server."""
    return backoff_delay(
        failures, initial=RETRY_INITIAL_S, multiplier=2.0, cap=RETRY_CAP_S, jitter=0.5
    )


def add_connection_options(parser: argparse.ArgumentParser, *, after_command: bool) -> None:
    """The connection flags; `after_command`: on a subcommand's parser, without defaults of
    its own (the main parser's apply)."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if after_command else {}
    group = parser.add_argument_group(
        "connection",
        f"The API key is read only from ${API_KEY_ENV}, never from a flag: the command line"
        " is visible to every user of the machine.",
    )
    group.add_argument(
        "--address",
        metavar="ADDR",
        help=f"host:port, http://host:port or https://host:port (default: ${ADDRESS_ENV},"
        f" else {DEFAULT_ADDRESS})",
        **(default or {"default": os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS}),
    )
    group.add_argument(
        "--tls", action="store_true", help="use TLS with the system roots", **default
    )
    group.add_argument(
        "--tls-ca-cert", metavar="PATH", help="a private CA (PEM); implies TLS", **default
    )
    group.add_argument(
        "--tls-domain", metavar="NAME", help="verify the server certificate for NAME", **default
    )
    group.add_argument(
        "--connect-timeout",
        metavar="S",
        type=positive_seconds,
        help="seconds to open a connection (default: 5)",
        **(default or {"default": 5.0}),
    )


def open_client(args: argparse.Namespace) -> AbstractAsyncContextManager[sepp.Client]:
    return sepp.open(
        args.address,
        api_key=os.environ.get(API_KEY_ENV) or None,
        tls=True if args.tls else None,
        tls_ca_cert=args.tls_ca_cert,
        tls_domain=args.tls_domain,
        connect_timeout=args.connect_timeout,
        logger=logging.getLogger("sepp"),
    )


async def run_connected(
    args: argparse.Namespace,
    body: Callable[[sepp.Client], Awaitable[T]],
    *,
    on_waiting: Callable[[], None] | None = None,
) -> T:
    """Connect, then run `body(client)`. The worker and the scheduler are often started
    alongside the server: while it is not reachable yet, connecting is retried with backoff
    (each failure logged, `on_waiting` called); failures once connected are `body`'s."""
    failures = 0
    while True:
        connected = False
        try:
            async with open_client(args) as client:
                connected = True
                return await body(client)
        except (sepp.ConnectError, sepp.TransportError) as exc:
            if connected:
                raise
            failures += 1
            delay = retry_delay(failures)
            if on_waiting is not None:  # first: the probes (a thread of their own) read it
                on_waiting()
            log.warning(
                "server not reachable yet (%s; failure %d); retrying in %.1fs",
                exc,
                failures,
                delay,
            )
            await concurrency.current().sleep(delay)
