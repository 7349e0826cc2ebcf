"""`sepp-trio worker MODULE:ATTR`: run a sepp.Worker with a Router's handlers until signalled."""

from __future__ import annotations

import argparse
import logging
import signal

import trio

import sepp

from ._connect import open_client
from ._failures import EXIT_FAILURE, EXIT_OK, UsageError
from ._signals import run_until_signalled
from ._targets import load_target
from ._values import positive_int, positive_seconds, seconds

log = logging.getLogger("sepp.cli")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "worker",
        help="process jobs with the handlers of a sepp.Router",
        description="Process jobs from the queues with the handlers of a sepp.Router, named as"
        " MODULE:ATTR (ATTR may also be a zero-argument callable returning a Router; the"
        " current directory is importable). The router's lifespan, middleware, timeouts and"
        " backoff apply. SIGINT or SIGTERM shuts down gracefully: no new"
        " jobs, running handlers get --shutdown-timeout seconds. A second signal stops at"
        " once: running handlers are cancelled and their jobs go back to the queue. Logs go to"
        " stderr. Exit status 0 after a shutdown that settled every job.",
    )
    parser.add_argument("target", metavar="MODULE:ATTR")
    parser.add_argument(
        "--queue",
        metavar="Q",
        dest="queues",
        action="append",
        required=True,
        help="a queue to reserve from (repeatable; earlier queues first)",
    )
    parser.add_argument(
        "--max-in-flight", metavar="N", type=positive_int, default=16, help="default: 16"
    )
    parser.add_argument(
        "--lease", metavar="S", type=positive_seconds, default=30.0, help="default: 30"
    )
    parser.add_argument(
        "--no-auto-extend",
        dest="auto_extend",
        action="store_false",
        help="do not extend the leases of long-running handlers",
    )
    parser.add_argument(
        "--shutdown-timeout", metavar="S", type=seconds, default=30.0, help="default: 30"
    )
    parser.add_argument(
        "--max-jobs", metavar="N", type=positive_int, help="cap on the jobs one reserve asks for"
    )
    parser.set_defaults(run=run, default_log_level="info")


def load_router(spec: str) -> sepp.Router:
    router = load_target(spec, sepp.Router, "a sepp.Router")
    if not router.job_types and not router.has_catch_all:
        raise UsageError(f"{spec} has no handlers")
    return router


async def run(args: argparse.Namespace) -> int:
    router = load_router(args.target)
    async with open_client(args) as client:
        worker = sepp.Worker(
            client,
            args.queues,
            handlers=router,
            lease_duration=args.lease,
            max_in_flight=args.max_in_flight,
            auto_extend=args.auto_extend,
            shutdown_timeout=args.shutdown_timeout,
            max_jobs=args.max_jobs,
        )

        def graceful(sig: signal.Signals) -> None:
            log.info(
                "%s: shutting down; waiting up to %gs for %d job(s) (a second signal stops now)",
                sig.name,
                args.shutdown_timeout,
                worker.in_flight,
            )
            worker.shutdown()

        def immediate(sig: signal.Signals) -> None:
            log.warning(
                "%s, a second signal: stopping now; cancelling %d job(s) and returning them",
                sig.name,
                worker.in_flight,
            )
            worker._end_grace_period()

        async def work() -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                handles = ", ".join(router.job_types) or "-"
                log.info(
                    "worker %s reserving from %s at %s; handles: %s%s",
                    worker.worker_id,
                    ", ".join(args.queues),
                    client.address,
                    handles,
                    " (and a catch-all)" if router.has_catch_all else "",
                )

        hard_stopped = await run_until_signalled(work, [graceful, immediate])
        if hard_stopped:
            log.error(
                "stopped without settling the jobs held: they return when their leases expire"
            )
            return EXIT_FAILURE
    log.info("worker %s stopped", worker.worker_id)
    return EXIT_OK
