"""`sepp-trio worker MODULE:ATTR`: run a sepp.Worker with a Router's handlers until signalled."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
from typing import TYPE_CHECKING

import trio

import sepp

from .._model import validate as _validate
from .._runtime import concurrency
from .._worker.monitor import DEFAULT_MAX_LOOP_LAG_S
from ._connect import retry_delay, run_connected
from ._failures import EXIT_FAILURE, EXIT_OK, UsageError
from ._signals import on_pause_signals, run_until_signalled
from ._targets import load_target
from ._values import positive_int, positive_seconds, seconds

if TYPE_CHECKING:
    from .fleet.child import SupervisorLink

log = logging.getLogger("sepp.cli")
LOOPS = ("trio", "asyncio", "uvloop")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "worker",
        help="process jobs with the handlers of a sepp.Router",
        description="Process jobs from the queues with the handlers of a sepp.Router, named as"
        " MODULE:ATTR (ATTR may also be a zero-argument callable returning a Router; the"
        " current directory is importable). The router's lifespan, middleware, timeouts and"
        " backoff apply. SIGINT or SIGTERM shuts down gracefully: no new"
        " jobs, running handlers get --shutdown-timeout seconds. A second signal stops at"
        " once: running handlers are cancelled and their jobs go back to the queue. SIGUSR1"
        " pauses the worker (no new jobs; running and waiting ones finish, their leases kept),"
        " SIGUSR2 resumes it. If the"
        " server is not up yet, connecting is retried with backoff until it is. Logs go to"
        " stderr. Exit status 0 after a shutdown that settled every job.",
    )
    parser.add_argument("target", metavar="MODULE:ATTR")
    parser.add_argument(
        "--queue",
        metavar="Q",
        dest="queues",
        action="append",
        required=True,
        type=queue_name,
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
    parser.add_argument(
        "--loop-block-warning",
        metavar="S",
        type=seconds,
        default=1.0,
        help="log a warning naming the job when an async def handler holds the event loop"
        " (runs without awaiting) longer than this, at most once a minute; 0: never"
        " (default: 1)",
    )
    http = parser.add_argument_group(
        "probes and metrics",
        "Served over plain HTTP (GET only, one request per connection); the same port may"
        " serve both.",
    )
    http.add_argument(
        "--health-port",
        metavar="PORT",
        type=port_number,
        help="serve /healthz (200 while the worker runs and its event loop is not held past"
        " --max-loop-lag) and /readyz (200 while also connected, reserving and not shutting"
        " down; else 503 with the reason)",
    )
    http.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=port_number,
        help="serve /metrics in the Prometheus text format",
    )
    http.add_argument(
        "--max-loop-lag",
        metavar="S",
        type=positive_seconds,
        default=DEFAULT_MAX_LOOP_LAG_S,
        help="/healthz answers 503 once the event loop has gone this long without running"
        f" (a handler holds it; default: {DEFAULT_MAX_LOOP_LAG_S:g}, the default lease)",
    )
    http.add_argument(
        "--http-host",
        metavar="HOST",
        help="the address to serve them on (default: every interface)",
    )
    parser.add_argument(
        "--burst",
        action="store_true",
        help="work until the queues have nothing ready and no job is held, then exit 0"
        " (sepp.Worker.run(until_idle=True): jobs scheduled for later are not waited for)",
    )
    parser.add_argument(
        "--processes",
        metavar="N",
        type=process_count,
        default=1,
        help="run N worker processes of the target under a supervisor (auto: one per usable"
        " CPU), for CPU-bound handlers; signals are passed on, a child that dies is replaced,"
        " and --health-port/--metrics-port serve the group (default: 1, no supervisor)",
    )
    parser.add_argument(
        "--paused",
        action="store_true",
        help="start paused: reserve nothing until SIGUSR2 (SIGUSR1 pauses again)",
    )
    parser.add_argument(
        "--reload",
        action="store_true",
        help="for development: run the worker under a supervisor that replaces it when a .py"
        " file of the target's package changes (the old process stops reserving at once and"
        " finishes its running jobs, up to --shutdown-timeout, then the new one starts; files"
        " are polled, no extra dependency)",
    )
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default="trio",
        help="the event loop to run the worker on: trio (default), asyncio, or uvloop"
        " (asyncio and uvloop run handlers written for asyncio; they need the 'asyncio'"
        " extra, and uvloop installed)",
    )
    parser.set_defaults(run=run, default_log_level="info")


def queue_name(text: str) -> str:
    """Checked here, so a bad name is refused before waiting for the server."""
    try:
        return _validate.queue_name("--queue", text)
    except sepp.ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).partition(": ")[2]) from None


def process_count(text: str) -> int:
    if text == "auto":
        return usable_cpus()
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"not a positive number or auto: {text!r}")
    return count


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, cgroup-unaware as CPython is)."""
    counter = getattr(os, "process_cpu_count", None)  # Python 3.13
    if counter is not None:
        return int(counter() or 1)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS)
        return os.cpu_count() or 1


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    return port


def load_router(spec: str) -> sepp.Router:
    router = load_target(spec, sepp.Router, "a sepp.Router")
    if not router.job_types and not router.has_catch_all:
        raise UsageError(f"{spec} has no handlers")
    return router


async def run(args: argparse.Namespace, link: SupervisorLink | None = None) -> int:
    """The command; `link`: to the supervisor, under `--processes N`."""
    router = load_router(args.target)
    serving = args.health_port is not None or args.metrics_port is not None
    monitor = sepp.WorkerMonitor(max_loop_lag=args.max_loop_lag) if serving else None
    workers: list[sepp.Worker] = []  # the worker, once connected
    paused = [bool(getattr(args, "paused", False))]  # SIGUSR1/SIGUSR2's last word
    cc = concurrency.current()  # trio's, or anyio's with --loop asyncio or uvloop
    connecting = cc.cancel_scope()

    def graceful(sig: signal.Signals) -> None:
        if not workers:
            log.info("%s: stopping; the server was never reached", sig.name)
            connecting.cancel()
            return
        log.info(
            "%s: shutting down; waiting up to %gs for %d job(s) (a second signal stops now)",
            sig.name,
            args.shutdown_timeout,
            workers[0].in_flight,
        )
        workers[0].shutdown()

    def immediate(sig: signal.Signals) -> None:
        if not workers:
            connecting.cancel()
            return
        log.warning(
            "%s, a second signal: stopping now; cancelling %d job(s) and returning them",
            sig.name,
            workers[0].in_flight,
        )
        workers[0].shutdown(now=True)

    def pause(sig: signal.Signals) -> None:
        paused[0] = True
        held = workers[0].in_flight if workers else 0
        log.info("%s: pausing: no new jobs; %d held finish (SIGUSR2 resumes)", sig.name, held)
        if workers:
            workers[0].pause()

    def resume(sig: signal.Signals) -> None:
        paused[0] = False
        log.info("%s: resuming", sig.name)
        if workers:
            workers[0].resume()

    async def connected(client: sepp.Client) -> None:
        worker = sepp.Worker(
            client,
            args.queues,
            handlers=router,
            lease_duration=args.lease,
            max_in_flight=args.max_in_flight,
            auto_extend=args.auto_extend,
            shutdown_timeout=args.shutdown_timeout,
            max_jobs=args.max_jobs,
            monitor=monitor,
            loop_block_warning=args.loop_block_warning or None,
        )
        if paused[0]:
            worker.pause()
        workers.append(worker)
        async with cc.open_nursery() as nursery:

            async def run_worker(task_status: trio.TaskStatus[None]) -> None:
                await worker.run(until_idle=args.burst, task_status=task_status)
                nursery.cancel_scope.cancel()  # done: nothing left to announce

            await nursery.start(run_worker)
            await key_accepted(client)
            if link is not None:
                link.reserving(worker.worker_id)
            handles = ", ".join(router.job_types) or "-"
            log.info(
                "worker %s reserving from %s at %s; handles: %s%s%s",
                worker.worker_id,
                ", ".join(args.queues),
                client.address,
                handles,
                " (and a catch-all)" if router.has_catch_all else "",
                "; paused (SIGUSR2 resumes)" if worker.is_paused else "",
            )

    async def work() -> None:
        from .._worker.monitor import feed_of  # what the monitor is told, beside the Worker

        async with cc.open_nursery() as http:
            await http.start(on_pause_signals, pause, resume)  # before the supervisor sends any
            if link is not None:
                link.accept_signals()
            if monitor is not None:
                ports = await serve_monitor(http, monitor, args, link)
                if link is not None:
                    link.serving(ports)
            if link is not None:

                async def orphaned() -> None:
                    await link.supervisor_gone()
                    log.warning("the supervisor is gone")
                    graceful(signal.SIGTERM)

                http.start_soon(orphaned)
            with connecting:
                await run_connected(
                    args,
                    connected,
                    on_waiting=feed_of(monitor).waiting_for_server if monitor is not None else None,
                )
            http.cancel_scope.cancel()

    hard_stopped = await run_until_signalled(work, [graceful, immediate])
    if hard_stopped:
        log.error("stopped without settling the jobs held: they return when their leases expire")
        return EXIT_FAILURE
    if workers:
        log.info("worker %s stopped", workers[0].worker_id)
    return EXIT_OK


async def key_accepted(client: sepp.Client) -> None:
    """Return once the server accepts the client's API key (asked by a get_server_info, which
    needs it as reserve does), so that a worker whose key is refused never says it is
    reserving: its own reserves log the refusal meanwhile."""
    failures = 0
    while True:
        try:
            await client.get_server_info()
            return
        except sepp.UnauthenticatedError:
            failures += 1
            await concurrency.current().sleep(retry_delay(failures))
        except sepp.SeppError:
            return  # not about the key: the worker's reserves say what it is


async def serve_monitor(
    nursery: concurrency.Nursery,
    monitor: sepp.WorkerMonitor,
    args: argparse.Namespace,
    link: SupervisorLink | None = None,
) -> dict[str, int]:
    """The probes and the metrics, on one port or two; listening before the server is up
    (under a supervisor, the probes' port also answers its health route). Returns the bound
    ports: "health", "metrics"."""
    from .._worker.monitor import routes_of, serve_routes

    bound_ports: dict[str, int] = {}
    servers: list[tuple[int, set[str]]] = []
    if args.health_port is not None:
        servers.append((args.health_port, {"health"}))
    if args.metrics_port is not None:
        if servers and args.metrics_port == args.health_port != 0:  # 0: a free port each
            servers[0][1].add("metrics")
        else:
            servers.append((args.metrics_port, {"metrics"}))
    for port, what in servers:
        routes = routes_of(monitor, health="health" in what, metrics="metrics" in what)
        if link is not None and "health" in what:
            routes.update(link.health_route(monitor))
        bound = await nursery.start(
            functools.partial(serve_routes, monitor, routes, port, host=args.http_host)
        )
        paths = (["/healthz", "/readyz"] if "health" in what else []) + (
            ["/metrics"] if "metrics" in what else []
        )
        log.info("serving %s on %s:%d", " ".join(paths), args.http_host or "*", bound)
        bound_ports.update(dict.fromkeys(what, bound))
    return bound_ports
