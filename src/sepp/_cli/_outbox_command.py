"""`sepp-trio outbox init|relay|status|requeue-rejected`: the transactional outbox's table and
its relay."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from typing import Any

import trio

import sepp

from .._model.errors import ValidationError
from .._outbox import dialects
from .._outbox.store import Store, open_store
from ._connect import run_connected
from ._failures import EXIT_OK, UsageError
from ._signals import run_until_signalled
from ._values import positive_int, positive_seconds
from ._worker_command import port_number

log = logging.getLogger("sepp.cli")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "outbox",
        help="create an outbox table, or relay its jobs to the server",
        description="The transactional outbox (sepp.Outbox): jobs your application writes into"
        " its own database in its own transactions, and the relay that forwards them.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    init = actions.add_parser(
        "init",
        help="create the outbox table (if it does not exist)",
        description="Create the outbox table and its index in the database, if they do not"
        " exist; with --print, print the SQL instead (for a migration of your own).",
    )
    _add_database(init)
    init.add_argument(
        "--print",
        dest="print_sql",
        metavar="DIALECT",
        choices=dialects.DIALECTS,
        help="print the DDL for sqlite or postgresql and touch no database",
    )
    init.set_defaults(run=run_init)

    relay = actions.add_parser(
        "relay",
        help="forward the outbox's jobs to the server until signalled",
        description="Forward the jobs in the outbox table to the server, oldest first, in"
        " batches; a row is deleted once the server has the job, a rejected job stays in the"
        " table as 'rejected' with the reason. Run as many relays as you like on one table. If"
        " the server is not reachable, the relay retries with backoff. SIGINT or SIGTERM stops"
        " it after the batch in hand; a second signal stops it at once. Exit status 0 after a"
        " signal.",
    )
    _add_database(relay)
    relay.add_argument(
        "--batch-size",
        metavar="N",
        type=positive_int,
        default=100,
        help="rows per batch (default: 100)",
    )
    relay.add_argument(
        "--poll-interval",
        metavar="S",
        type=positive_seconds,
        default=0.25,
        help="sqlite3: how often to look for new rows (default: 0.25); PostgreSQL is woken"
        " by NOTIFY",
    )
    relay.add_argument(
        "--claim-timeout",
        metavar="S",
        type=positive_seconds,
        default=60.0,
        help="how long a relay holds the rows it is sending; those of a relay that died are"
        " sent by another after it (default: 60)",
    )
    relay.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=port_number,
        help="serve /metrics in the Prometheus text format",
    )
    relay.add_argument(
        "--http-host",
        metavar="HOST",
        help="the address to serve them on (default: every interface)",
    )
    relay.set_defaults(run=run_relay, default_log_level="info")

    status = actions.add_parser(
        "status",
        help="print the rows waiting and rejected, as JSON",
        description="Print {waiting, oldest_age_s, rejected} for the outbox table as JSON.",
    )
    _add_database(status)
    status.set_defaults(run=run_status)

    requeue = actions.add_parser(
        "requeue-rejected",
        help="make the rejected rows pending again",
        description="After fixing what the server refused (a queue's job types, a limit), make"
        " every rejected row pending again, for the relays to send.",
    )
    _add_database(requeue)
    requeue.set_defaults(run=run_requeue)


def _add_database(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database",
        metavar="URL",
        help="sqlite:///relative.db, sqlite:////absolute.db or postgresql://user@host/db",
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        default="sepp_outbox",
        help="the outbox table (default: sepp_outbox)",
    )


def _outbox(args: argparse.Namespace) -> sepp.Outbox:
    try:
        return sepp.Outbox(args.table)
    except ValidationError as exc:
        raise UsageError(f"--table: {exc}") from None


def _store(args: argparse.Namespace) -> Store:
    if not args.database:
        raise UsageError("--database URL is required")
    outbox = _outbox(args)
    try:
        return open_store(args.database, outbox.table, outbox.channel)
    except ValidationError as exc:
        raise UsageError(f"--database: {exc}") from None


async def run_init(args: argparse.Namespace) -> int:
    outbox = _outbox(args)
    if args.print_sql:
        sys.stdout.write(outbox.ddl(args.print_sql))
        return EXIT_OK
    store = _store(args)

    def create() -> None:
        try:
            connection: Any = store.connection()
            outbox.create_table(connection)
            connection.commit()
        finally:
            store.close()

    await trio.to_thread.run_sync(create)
    log.info("outbox table %s ready", outbox.table)
    return EXIT_OK


async def run_status(args: argparse.Namespace) -> int:
    store = _store(args)

    def count() -> dict[str, object]:
        try:
            backlog = store.backlog()
        finally:
            store.close()
        return {
            "waiting": backlog.waiting,
            "oldest_age_s": round(backlog.oldest_age_s, 3),
            "rejected": backlog.rejected,
        }

    print(json.dumps(await trio.to_thread.run_sync(count)))
    return EXIT_OK


async def run_requeue(args: argparse.Namespace) -> int:
    store = _store(args)

    def requeue() -> int:
        try:
            return store.requeue_rejected()
        finally:
            store.close()

    count = await trio.to_thread.run_sync(requeue)
    print(json.dumps({"requeued": count}))
    return EXIT_OK


async def run_relay(args: argparse.Namespace) -> int:
    _store(args).close()  # the URL and table checked before waiting for the server
    relay = sepp.OutboxRelay(
        args.database,
        outbox=_outbox(args),
        batch_size=args.batch_size,
        poll_interval=args.poll_interval,
        claim_timeout=args.claim_timeout,
        logger=logging.getLogger("sepp.outbox"),
    )
    stopping = connected = False
    connecting = trio.CancelScope()

    def graceful(sig: signal.Signals) -> None:
        nonlocal stopping
        log.info("%s: stopping the relay after its batch (a second signal stops at once)", sig.name)
        stopping = True
        relay.shutdown()
        if not connected:
            connecting.cancel()  # still waiting for the server: nothing to finish

    async def relay_jobs(client: sepp.Client) -> None:
        nonlocal connected
        connected = True
        if not stopping:
            await relay.run(client)

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            if args.metrics_port is not None:
                port = await nursery.start(
                    lambda task_status: relay.serve_metrics(
                        args.metrics_port, host=args.http_host, task_status=task_status
                    )
                )
                log.info("serving /metrics on port %d", port)
            with connecting:
                await run_connected(args, relay_jobs)
            nursery.cancel_scope.cancel()

    await run_until_signalled(body, [graceful])
    log.info("relay stopped")
    return EXIT_OK
