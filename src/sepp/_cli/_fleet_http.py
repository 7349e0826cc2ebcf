"""The group's `/healthz`, `/readyz` and `/metrics` under `sepp-trio worker --processes N`.

Each child serves its own on ports of its own (127.0.0.1, reported over its pipe); the
supervisor asks every child when it is asked, so an answer is never older than the request:
- `/healthz`: 200 unless a running child's own `/healthz` fails or does not answer (a child
  being restarted is the supervisor's business, not a reason to restart the group);
- `/readyz`: 200 when every child runs and is ready, else 503 naming the ones that are not;
- `/metrics`: every child's families merged, one family each, each sample labelled
  `process="<index>"` (the slot, 0 to N-1, kept across restarts, so a replaced child's
  counters restart from zero as Prometheus expects of a restarted target), plus the group's
  own: `sepp_worker_process_up` and `sepp_worker_process_restarts_total`.
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import trio

from .._worker.http_responder import TEXT, Response, parse_request_line, read_head, render
from .._worker.monitor import PROMETHEUS_TEXT

log = logging.getLogger("sepp.cli")

CHILD_ANSWER_TIMEOUT_S = 2.0  # a child's probe that takes longer counts as failed
WRITE_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32  # served at once; more are closed unanswered
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a child's metrics: bounded as any read should be

AsyncRoute = Callable[[], Awaitable[Response]]


class Child(Protocol):
    """What the supervisor knows of one child (`_supervisor.Child`)."""

    @property
    def index(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def running(self) -> bool: ...
    @property
    def state(self) -> str: ...
    @property
    def ports(self) -> dict[str, int]: ...
    @property
    def restarts(self) -> int: ...


class Fleet(Protocol):
    """What the supervisor knows of the group (`_supervisor.Fleet`)."""

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


class GroupProbes:
    """The routes: asking the children of `fleet`."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    async def _ask(self, port_name: str, path: str) -> dict[int, tuple[int, str] | None]:
        """`path` from every running child that serves `port_name`, by child index."""
        answers: dict[int, tuple[int, str] | None] = {}

        async def ask(child: Child, port: int) -> None:
            answers[child.index] = await child_get(port, path)

        async with trio.open_nursery() as nursery:
            for child in self._fleet.children:
                port = child.ports.get(port_name)
                if child.running and port is not None:
                    nursery.start_soon(ask, child, port)
        return answers

    async def _probe(self, path: str, *, ready: bool) -> Response:
        answers = await self._ask("health", path)
        ok: list[str] = []
        failing: list[str] = []
        for child in self._fleet.children:
            answer = answers.get(child.index)
            if not child.running:
                (failing if ready else ok).append(f"child {child.index}: {child.state}")
            elif child.index not in answers:  # its port not known yet
                (failing if ready else ok).append(f"{child.label}: starting")
            elif answer is None:
                failing.append(f"{child.label}: no answer within {CHILD_ANSWER_TIMEOUT_S:g}s")
            else:
                status, body = answer
                first, _, rest = body.strip().partition("\n")
                what = first.partition(": ")[2] or first
                lag = rest.strip().removeprefix("event loop lag: ")
                if lag and lag != rest.strip():  # the child's loop lag, on one line
                    what += f" (loop lag {lag})"
                (ok if status == 200 else failing).append(f"{child.label}: {what}")
        if ready and self._fleet.stopping:
            failing.insert(0, "shutting down")
        if failing:
            return 503, TEXT, f"not ready: {'; '.join(failing)}\n".encode()
        return 200, TEXT, f"ok: {'; '.join(ok)}\n".encode()

    async def healthz(self) -> Response:
        return await self._probe("/healthz", ready=False)

    async def readyz(self) -> Response:
        return await self._probe("/readyz", ready=True)

    async def metrics(self) -> Response:
        answers = await self._ask("metrics", "/metrics")
        texts = {
            index: answer[1]
            for index, answer in answers.items()
            if answer is not None and answer[0] == 200
        }
        out = merge_metrics(texts)
        children = self._fleet.children
        out += [
            "# HELP sepp_worker_process_up 1 if the worker process answered this scrape.",
            "# TYPE sepp_worker_process_up gauge",
            *(
                f'sepp_worker_process_up{{process="{c.index}"}} {int(c.index in texts)}'
                for c in children
            ),
            "# HELP sepp_worker_process_restarts_total Worker processes started again after an"
            " unexpected exit.",
            "# TYPE sepp_worker_process_restarts_total counter",
            *(
                f'sepp_worker_process_restarts_total{{process="{c.index}"}} {c.restarts}'
                for c in children
            ),
        ]
        return 200, PROMETHEUS_TEXT, ("\n".join(out) + "\n").encode()


def merge_metrics(texts: dict[int, str]) -> list[str]:
    """The children's Prometheus texts as one: each family's HELP and TYPE once, then its
    samples from every child, each with a `process` label (the child's index)."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    for index, text in sorted(texts.items()):
        family: tuple[list[str], list[str]] | None = None
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                name = line.split(" ", 3)[2]
                family = families.setdefault(name, ([], []))
                if not any(seen.startswith(line[:7]) for seen in family[0]):
                    family[0].append(line)
            elif line and not line.startswith("#"):
                if family is None:  # a sample before any HELP/TYPE: a family of its own
                    family = families.setdefault(line.partition("{")[0].split(" ")[0], ([], []))
                family[1].append(with_process_label(line, index))
    return [line for header, samples in families.values() for line in (*header, *samples)]


def with_process_label(sample: str, index: int) -> str:
    """`name{a="b"} 1` -> `name{process="0",a="b"} 1`; `name 1` -> `name{process="0"} 1`."""
    label = f'process="{index}"'
    name, brace, rest = sample.partition("{")
    if brace and " " not in name:
        return f"{name}{{{label}{'' if rest.startswith('}') else ','}{rest}"
    name, _, value = sample.partition(" ")
    return f"{name}{{{label}}} {value}"


class GroupServer:
    """One GET per connection, as the worker's own responder; the routes are async."""

    def __init__(self, routes: dict[str, AsyncRoute]) -> None:
        self._routes = routes
        self._active = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            if self._active >= MAX_CONNECTIONS:
                return
            self._active += 1
            try:
                head = await read_head(stream.receive_some)
                response = head if isinstance(head, tuple) else await self._respond(head)
                with trio.move_on_after(WRITE_TIMEOUT_S):
                    await stream.send_all(render(*response))
            finally:
                self._active -= 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away
        finally:
            await trio.aclose_forcefully(stream)

    async def _respond(self, head: bytes) -> Response:
        path = parse_request_line(head)
        if not isinstance(path, str):
            return path
        route = self._routes.get(path)
        if route is None:
            return 404, TEXT, f"not found; try {', '.join(sorted(self._routes))}\n".encode()
        try:
            return await route()
        except Exception as exc:  # a probe must get an answer, and the server must live on
            return 500, TEXT, f"{type(exc).__name__}: {exc}\n".encode()


async def serve_group(nursery: trio.Nursery, fleet: Fleet, args: argparse.Namespace) -> None:
    """The group's probes and metrics on the ports the command line names (one port may serve
    both, as for one worker), until the nursery is cancelled."""
    probes = GroupProbes(fleet)
    servers: list[tuple[int, dict[str, AsyncRoute]]] = []
    health = {"/healthz": probes.healthz, "/readyz": probes.readyz}
    if args.health_port is not None:
        servers.append((args.health_port, dict(health)))
    if args.metrics_port is not None:
        if servers and args.metrics_port == args.health_port != 0:  # 0: a free port each
            servers[0][1]["/metrics"] = probes.metrics
        else:
            servers.append((args.metrics_port, {"/metrics": probes.metrics}))
    for port, routes in servers:
        server = GroupServer(routes)
        serve = functools.partial(trio.serve_tcp, server.handle, port, host=args.http_host)
        listeners = await nursery.start(serve)
        bound = listeners[0].socket.getsockname()[1]
        log.info(
            "serving %s on %s:%d (for the %d worker processes)",
            " ".join(routes),
            args.http_host or "*",
            bound,
            len(fleet.children),
        )
