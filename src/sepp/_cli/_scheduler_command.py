"""`sepp-trio scheduler MODULE:ATTR`: run a sepp.Scheduler for a Schedule until signalled."""

from __future__ import annotations

import argparse
import logging
import signal

import trio

import sepp

from .._model.types import EnqueueAck, EnqueueRequest, ServerInfo
from .._scheduling.schedule import MISSED_POLICIES
from ._connect import run_connected
from ._failures import EXIT_OK, UsageError
from ._signals import run_until_signalled
from ._targets import load_target
from ._values import positive_seconds

log = logging.getLogger("sepp.cli")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "scheduler",
        help="enqueue the periodic jobs of a sepp.Schedule",
        description="Enqueue every occurrence of a sepp.Schedule, named as MODULE:ATTR (ATTR"
        " may also be a zero-argument callable returning a Schedule; the current directory is"
        " importable). Run as many as you like: each occurrence becomes one job. If the server"
        " is not up yet, connecting is retried with backoff until it is. SIGINT or SIGTERM"
        " stops the scheduler; a second signal stops it at once. Logs go to stderr. Exit"
        " status 0 after a signal.",
    )
    parser.add_argument("target", metavar="MODULE:ATTR")
    parser.add_argument(
        "--lookahead",
        metavar="S",
        type=positive_seconds,
        default=60.0,
        help="enqueue each occurrence this many seconds ahead (default: 60)",
    )
    parser.add_argument(
        "--missed",
        choices=MISSED_POLICIES,
        default="latest",
        help="past occurrences not enqueued yet: the newest of each entry (latest), every one"
        " (all), or only those under a minute old (skip); default: latest",
    )
    parser.set_defaults(run=run, default_log_level="info")


def load_schedule(spec: str) -> sepp.Schedule:
    schedule = load_target(spec, sepp.Schedule, "a sepp.Schedule")
    if not len(schedule):
        raise UsageError(f"{spec} has no entries")
    return schedule


class _LateClient:
    """The scheduler's client, connected after the Scheduler is built: its settings are checked
    before the first connection attempt, which may wait for the server for a long time."""

    def __init__(self) -> None:
        self.client: sepp.Client | None = None

    def _connected(self) -> sepp.Client:
        assert self.client is not None, "the scheduler runs only once connected"
        return self.client

    async def enqueue(self, request: EnqueueRequest, /) -> EnqueueAck:
        return await self._connected().enqueue(request)

    async def get_server_info(self) -> ServerInfo:
        return await self._connected().get_server_info()


async def run_scheduler(
    scheduler: sepp.Scheduler,
    schedule: sepp.Schedule,
    client: sepp.Client,
    args: argparse.Namespace,
) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        log.info(
            "scheduler enqueueing %s at %s (lookahead %gs, missed=%s)",
            ", ".join(schedule.names),
            client.address,
            args.lookahead,
            args.missed,
        )


async def run(args: argparse.Namespace) -> int:
    schedule = load_schedule(args.target)
    late = _LateClient()
    scheduler = sepp.Scheduler(
        late,
        schedule,
        lookahead=args.lookahead,
        missed=args.missed,
    )
    connecting = trio.CancelScope()

    def graceful(sig: signal.Signals) -> None:
        log.info("%s: stopping the scheduler (a second signal stops at once)", sig.name)
        scheduler.shutdown()
        if late.client is None:
            connecting.cancel()  # still waiting for the server: nothing to finish

    async def connected(client: sepp.Client) -> None:
        late.client = client
        await run_scheduler(scheduler, schedule, client, args)

    async def schedule_jobs() -> None:
        with connecting:
            await run_connected(args, connected)

    # The first signal stops the scheduler, which returns promptly; a second one cancels what
    # is left (closing the connection). Either way nothing is lost: an enqueue cut short is
    # repeated safely by its idempotency key, by this scheduler's next run or by another one.
    await run_until_signalled(schedule_jobs, [graceful])
    log.info("scheduler stopped")
    return EXIT_OK
