"""What the memory server does between its connections and its state, with no I/O: calls in
(from every `ServerConnection`), replies out; waiting Reserves woken when their queues get
jobs and answered empty at their deadline; calls past their `grpc-timeout` cancelled; the
state swept when its timers fall due. The driver asks `next_wakeup()` when to call
`on_time()`, and calls `stop()` to shut down as the real server does: waiting Reserves
return empty, connections get GOAWAY and close once their calls are answered."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

from .calls import CANCELLED, Call, ServerSide
from .clock import ServerClock
from .codec_server import CodecServerConnection
from .config import WIRE_ENGINES, MemoryConfig
from .service import EMPTY_RESERVE, UNIMPLEMENTED, QueueService, Reply, Waiting
from .state import QueueState


class _Waiter:
    __slots__ = ("call", "deadline", "request", "seq")

    def __init__(self, call: Call, request: Waiting, deadline: float, seq: int) -> None:
        self.call = call
        self.request = request
        self.deadline = deadline  # the runtime's clock
        self.seq = seq


class ServerCore:
    def __init__(
        self,
        config: MemoryConfig,
        *,
        clock: ServerClock,
        runtime_now: Callable[[], float],
        state: QueueState | None = None,
        wire_engine: str = "codec",
    ) -> None:
        if wire_engine not in WIRE_ENGINES:
            raise ValueError(f"wire_engine must be one of {WIRE_ENGINES}, got {wire_engine!r}")
        self._connection_class: type[ServerSide] = CodecServerConnection
        if wire_engine == "h2":  # h2 is imported only for the reference
            from .h2_server import ServerConnection

            self._connection_class = ServerConnection
        self.config = config
        self.clock = clock
        self.state = state or QueueState(dead_letter_retention_ms=config.dead_letter_retention_ms)
        self.service = QueueService(config, self.state)
        self._now = runtime_now
        self._waiters: dict[int, _Waiter] = {}  # in arrival order
        self._waiter_deadlines: list[tuple[float, int]] = []
        self._deadlines: list[tuple[float, int, Call]] = []  # grpc-timeouts
        self._seq = itertools.count()
        self.connections: set[ServerSide] = set()
        self.stopping = False
        self.calls_answered = 0  # for tests: how many calls got a reply

    # -- connections ------------------------------------------------------------------------

    def connection(self, on_output: Callable[[], None]) -> ServerSide:
        connection = self._connection_class(
            self,
            max_message_bytes=self.config.max_message_bytes,
            runtime_now=self._now,
            on_output=on_output,
        )
        self.connections.add(connection)
        if self.stopping:
            connection.goaway()
        return connection

    def closed(self, connection: ServerSide) -> None:
        connection.connection_lost()
        self.connections.discard(connection)

    # -- the Dispatcher protocol ------------------------------------------------------------

    def admit(self, call: Call) -> Reply | None:
        refused = self.service.authorize(call.path, call.authorization)
        if refused is not None:
            return refused
        if not self.service.knows(call.path):
            return Reply(UNIMPLEMENTED)
        return None

    def started(self, call: Call) -> None:
        if call.deadline != math.inf:
            heapq.heappush(self._deadlines, (call.deadline, next(self._seq), call))

    def dispatch(self, call: Call, body: bytes) -> None:
        if call.deadline <= self._now():
            self._answer(call, Reply(CANCELLED, "Timeout expired"))
            return
        outcome = self.service.call(call.path, body, self.clock.now_ms())
        if isinstance(outcome, Waiting):
            if self.stopping:
                self._answer(call, EMPTY_RESERVE)
            else:
                seq = next(self._seq)
                waiter = _Waiter(call, outcome, self._now() + outcome.wait_ms / 1000, seq)
                call.waiter = waiter
                self._waiters[seq] = waiter
                heapq.heappush(self._waiter_deadlines, (waiter.deadline, seq))
        else:
            self._answer(call, outcome)
        self._wake_waiters()

    def forget(self, call: Call) -> None:
        waiter = call.waiter
        if isinstance(waiter, _Waiter):
            self._waiters.pop(waiter.seq, None)
            call.waiter = None

    def _answer(self, call: Call, reply: Reply) -> None:
        self.forget(call)
        self.calls_answered += 1
        call.respond(reply)

    def _wake_waiters(self) -> None:
        woken = self.state.take_new_ready()
        if not woken or not self._waiters:
            return
        now_ms = self.clock.now_ms()
        for waiter in list(self._waiters.values()):
            if waiter.seq not in self._waiters or woken.isdisjoint(waiter.request.queues):
                continue
            reply = self.service.retry_reserve(waiter.request, now_ms)
            if reply is not None:
                self._answer(waiter.call, reply)
        self.state.take_new_ready()  # what the retries made ready is theirs already

    # -- time -------------------------------------------------------------------------------

    def next_wakeup(self) -> float:
        """When (the runtime's clock) `on_time` has something to do; inf: never by itself."""
        candidates = [math.inf]
        waits = self._waiter_deadlines
        while waits and waits[0][1] not in self._waiters:
            heapq.heappop(waits)
        if waits:
            candidates.append(waits[0][0])
        while self._deadlines and self._deadlines[0][2].answered:
            heapq.heappop(self._deadlines)
        if self._deadlines:
            candidates.append(self._deadlines[0][0])
        due_ms = self.state.next_deadline()
        if due_ms is not None:
            at = self.clock.runtime_at(due_ms, self._now())
            if at is not None:
                candidates.append(at)
        return min(candidates)

    def on_time(self) -> None:
        """Do what has fallen due: sweep, wake, expire waits and deadlines."""
        now = self._now()
        self.state.sweep(self.clock.now_ms())
        self._wake_waiters()
        waits = self._waiter_deadlines
        while waits and waits[0][0] <= now:
            waiter = self._waiters.get(heapq.heappop(waits)[1])
            if waiter is not None:
                self._answer(waiter.call, EMPTY_RESERVE)
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            call = heapq.heappop(deadlines)[2]
            if not call.answered:
                self._answer(call, Reply(CANCELLED, "Timeout expired"))

    # -- the end ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin the shutdown: waiting Reserves answered empty, GOAWAY on every connection."""
        self.stopping = True
        for waiter in list(self._waiters.values()):
            self._answer(waiter.call, EMPTY_RESERVE)
        for connection in list(self.connections):
            connection.goaway()

    @property
    def drained(self) -> bool:
        """Every connection has closed or has nothing left to answer."""
        return all(c.closed or c.idle for c in self.connections)
