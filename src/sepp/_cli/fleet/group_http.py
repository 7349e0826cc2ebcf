"""The group's `/healthz`, `/readyz` and `/metrics` under `sepp-trio worker --processes N`.

Each child serves its own on ports of its own (127.0.0.1, reported over its pipe); the
supervisor asks every child when it is asked, so an answer is never older than the request. A
child's health comes as data (`messages.Health`, on its `HEALTH_PATH`):
- `/healthz`: 200 unless a running child is not live or does not answer (a child being
  restarted is the supervisor's business, not a reason to restart the group);
- `/readyz`: 200 when every child runs and is ready, else 503 naming the ones that are not;
- `/metrics`: every child's families merged, one family each, each sample labelled
  `process="<index>"` (the slot, 0 to N-1, kept across restarts, so a replaced child's
  counters restart from zero as Prometheus expects of a restarted target), plus the group's
  own: `sepp_worker_process_up` and `sepp_worker_process_restarts_total`.

They are served by the threaded server every probe of sepp-trio uses (`_probes.server`): its
thread hands each request to the supervisor's trio run, which asks the children and answers.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from typing import Protocol, TypeVar

import trio

from ..._probes import prometheus
from ..._probes.http1 import TEXT, Response, Route
from ..._probes.server import ProbeServer
from ..._worker.monitor import Health
from .messages import HEALTH_PATH, MessageError, Ports, decode

log = logging.getLogger("sepp.cli")
T = TypeVar("T")

CHILD_ANSWER_TIMEOUT_S = 2.0  # a child's probe that takes longer counts as failed
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a child's metrics: bounded as any read should be

AsyncRoute = Callable[[], Awaitable[Response]]


class Child(Protocol):
    """What the supervisor knows of one child (`supervisor.Child`)."""

    @property
    def index(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def running(self) -> bool: ...
    @property
    def state(self) -> str: ...
    @property
    def ports(self) -> Ports: ...
    @property
    def restarts(self) -> int: ...


class Fleet(Protocol):
    """What the supervisor knows of the group (`supervisor.Fleet`)."""

    @property
    def children(self) -> Sequence[Child]: ...
    @property
    def stopping(self) -> bool: ...


async def child_get(port: int, path: str) -> tuple[int, str] | None:
    """GET `path` from a child's port on the loopback interface: (status, body), or None if
    it did not answer in time."""
    with trio.move_on_after(CHILD_ANSWER_TIMEOUT_S):
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: child\r\n\r\n".encode())
                answer = bytearray()
                while len(answer) <= MAX_ANSWER_BYTES:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    answer += chunk
        except (OSError, trio.BrokenResourceError):
            return None
        head, _, body = bytes(answer).partition(b"\r\n\r\n")
        try:
            return int(head.split()[1]), body.decode()
        except (IndexError, ValueError, UnicodeDecodeError):
            return None
    return None


async def child_health(port: int) -> Health | None:
    """A child's health, or None if it did not answer in time (or said no `Health`)."""
    answer = await child_get(port, HEALTH_PATH)
    if answer is None or answer[0] != 200:
        return None
    try:
        health = decode(answer[1].encode())
    except MessageError:
        return None
    return health if isinstance(health, Health) else None


class GroupProbes:
    """The routes: asking the children of `fleet`."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    async def _ask(
        self, port_of: Callable[[Ports], int | None], ask: Callable[[int], Awaitable[T]]
    ) -> dict[int, T]:
        """`ask(port)` of every running child that serves on `port_of` its ports, by index."""
        answers: dict[int, T] = {}

        async def ask_one(child: Child, port: int) -> None:
            answers[child.index] = await ask(port)

        async with trio.open_nursery() as nursery:
            for child in self._fleet.children:
                port = port_of(child.ports)
                if child.running and port is not None:
                    nursery.start_soon(ask_one, child, port)
        return answers

    async def _probe(self, *, ready: bool) -> Response:
        answers = await self._ask(lambda ports: ports.health, child_health)
        ok: list[str] = []
        failing: list[str] = []
        for child in self._fleet.children:
            if not child.running:
                (failing if ready else ok).append(f"child {child.index}: {child.state}")
            elif child.index not in answers:  # its port not known yet
                (failing if ready else ok).append(f"{child.label}: starting")
            elif (health := answers[child.index]) is None:
                failing.append(f"{child.label}: no answer within {CHILD_ANSWER_TIMEOUT_S:g}s")
            else:
                what = health.status
                if health.loop_lag is not None:
                    what += f" (loop lag {health.loop_lag:.3f}s)"
                passed = health.ready if ready else health.live
                (ok if passed else failing).append(f"{child.label}: {what}")
        if ready and self._fleet.stopping:
            failing.insert(0, "shutting down")
        if failing:
            return 503, TEXT, f"not ready: {'; '.join(failing)}\n".encode()
        return 200, TEXT, f"ok: {'; '.join(ok)}\n".encode()

    async def healthz(self) -> Response:
        return await self._probe(ready=False)

    async def readyz(self) -> Response:
        return await self._probe(ready=True)

    async def metrics(self) -> Response:
        answers = await self._ask(
            lambda ports: ports.metrics, lambda port: child_get(port, "/metrics")
        )
        texts = {
            str(index): answer[1]
            for index, answer in sorted(answers.items())
            if answer is not None and answer[0] == 200
        }
        families = prometheus.merge(texts, "process")
        up = prometheus.Family(
            "sepp_worker_process_up",
            "gauge",
            "1 if the worker process answered this scrape.",
        )
        restarts = prometheus.Family(
            "sepp_worker_process_restarts_total",
            "counter",
            "Worker processes started again after an unexpected exit.",
        )
        for child in self._fleet.children:
            up.add(int(str(child.index) in texts), process=str(child.index))
            restarts.add(child.restarts, process=str(child.index))
        text = prometheus.write([*families, up, restarts])
        return 200, prometheus.CONTENT_TYPE, text.encode()


def answered_on(token: trio.lowlevel.TrioToken, nursery: trio.Nursery, route: AsyncRoute) -> Route:
    """`route` as the server's threads call one: each request starts a task in `nursery`
    (through `token`), whose answer completes the future the server waits on."""

    def start() -> Future[Response]:
        future: Future[Response] = Future()

        async def answer() -> None:
            try:
                response = await route()
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(response)

        def spawn() -> None:
            try:
                nursery.start_soon(answer)
            except RuntimeError as exc:  # the group is stopping: no more tasks
                future.set_exception(exc)

        token.run_sync_soon(spawn)
        return future

    return start


async def serve_group(
    fleet: Fleet,
    args: argparse.Namespace,
    *,
    task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The group's probes and metrics on the ports the command line names (one port may serve
    both, as for one worker), until cancelled; `nursery.start()` returns the bound ports."""
    probes = GroupProbes(fleet)
    servers: list[tuple[int, dict[str, AsyncRoute]]] = []
    health: dict[str, AsyncRoute] = {"/healthz": probes.healthz, "/readyz": probes.readyz}
    if args.health_port is not None:
        servers.append((args.health_port, dict(health)))
    if args.metrics_port is not None:
        if servers and args.metrics_port == args.health_port != 0:  # 0: a free port each
            servers[0][1]["/metrics"] = probes.metrics
        else:
            servers.append((args.metrics_port, {"/metrics": probes.metrics}))
    token = trio.lowlevel.current_trio_token()
    async with trio.open_nursery() as answering:
        with contextlib.ExitStack() as serving:
            bound: list[int] = []
            for port, routes in servers:
                threaded = {path: answered_on(token, answering, r) for path, r in routes.items()}
                server = ProbeServer(threaded, port, host=args.http_host)
                serving.enter_context(server)
                bound.append(server.port)
                log.info(
                    "serving %s on %s:%d (for the %d worker processes)",
                    " ".join(routes),
                    args.http_host or "*",
                    server.port,
                    len(fleet.children),
                )
            task_status.started(bound)
            await trio.sleep_forever()
