"""A limit within one process (`scope="worker"`): per key, a counting semaphore for
`concurrency` and, for `rate` per `per`, the times of the last `rate` starts (a start is
allowed when fewer than `rate` fall in the last `per` seconds: a token bucket whose tokens each
come back `per` after they were taken). Waiters are admitted in the order they came, so a key's
jobs start in the order the Worker asked for them; keys are independent."""

from __future__ import annotations

import collections
import math

from .._runtime.concurrency import TRIO, Event, ServiceRuntime
from .admission import Admission, LimitStats
from .limit import Limit

# Idle keys (nothing running or waiting) are dropped once their rate history no longer counts;
# past this many keys held, idle ones are swept before a new one is made.
SWEEP_AT_KEYS = 1024


class _Ticket:
    __slots__ = ("admission", "event", "started_at")

    def __init__(self, event: Event, started_at: float) -> None:
        self.event = event
        self.started_at = started_at
        self.admission: Admission | None = None


class _KeyState:
    __slots__ = ("running", "starts", "waiters")

    def __init__(self) -> None:
        self.running = 0
        self.starts: collections.deque[float] = collections.deque()
        self.waiters: collections.deque[_Ticket] = collections.deque()

    def idle(self, now: float, per: float) -> bool:
        return (
            not self.running
            and not self.waiters
            and (not self.starts or self.starts[-1] <= now - per)
        )


class LocalLimiter:
    """One `Limit` with `scope="worker"`, for every key in this process."""

    def __init__(self, limit: Limit, cc: ServiceRuntime = TRIO) -> None:
        self.limit = limit
        self._concurrency = limit.concurrency
        self._rate = limit.rate
        self._per = limit.per
        self._keys: dict[str, _KeyState] = {}
        self._cc = cc

    # -- admitting ----------------------------------------------------------------------------

    def try_admit(self, key: str) -> Admission | None:
        """An admission now if one is free and nobody waits ahead; None otherwise."""
        state = self._state(key)
        now = self._cc.current_time()
        if state.waiters or self._next_start(state, now) > now:
            self._drop_if_idle(key, state, now)
            return None
        return self._start(key, state, now, 0.0)

    async def admit(self, key: str, *, patience_s: float = math.inf) -> Admission | None:
        """Wait up to `patience_s` for an admission (in arrival order); None when it ran out.
        A cancelled wait gives its place up (and an admission granted as it was cancelled)."""
        cc = self._cc
        state = self._state(key)
        now = cc.current_time()
        if not state.waiters and self._next_start(state, now) <= now:
            return self._start(key, state, now, 0.0)
        ticket = _Ticket(cc.event(), now)
        state.waiters.append(ticket)
        deadline = now + patience_s
        granted = False
        try:
            while True:
                if ticket.admission is not None:
                    granted = True
                    return ticket.admission
                now = cc.current_time()
                wake = deadline
                if state.waiters[0] is ticket:
                    # The head waits on the clock when only the rate holds it back.
                    ready_at = self._next_start(state, now)
                    if ready_at <= now:
                        self._pump(key, state, now)  # this one, and those behind it with room
                        continue
                    wake = min(wake, ready_at)
                if now >= deadline:
                    return None
                with cc.move_on_at(wake):
                    await ticket.event.wait()
                ticket.event = cc.event()
        finally:
            if not granted:
                if ticket.admission is not None:  # granted as the wait was cancelled
                    ticket.admission.release()
                else:
                    self._leave(key, state, ticket)

    def _leave(self, key: str, state: _KeyState, ticket: _Ticket) -> None:
        was_head = bool(state.waiters) and state.waiters[0] is ticket
        try:
            state.waiters.remove(ticket)
        except ValueError:
            pass
        now = self._cc.current_time()
        if was_head:
            self._pump(key, state, now)
        self._drop_if_idle(key, state, now)

    # -- the counts ---------------------------------------------------------------------------

    def _next_start(self, state: _KeyState, now: float) -> float:
        """When the next start may happen (≤ now: now; inf: when one running ends)."""
        if self._concurrency is not None and state.running >= self._concurrency:
            return math.inf
        if self._rate is not None:
            starts = state.starts
            while starts and starts[0] <= now - self._per:
                starts.popleft()
            if len(starts) >= self._rate:
                return starts[0] + self._per
        return now

    def _start(self, key: str, state: _KeyState, now: float, waited_s: float) -> Admission:
        if self._rate is not None:
            state.starts.append(now)
        if self._concurrency is None:
            admission = Admission(key, _nothing_to_release, waited_s)
            admission.released = True  # a rate token is spent on start: nothing to give back
            return admission
        state.running += 1
        return Admission(key, self._release, waited_s)

    def _grant(self, key: str, state: _KeyState, now: float) -> None:
        ticket = state.waiters.popleft()
        ticket.admission = self._start(key, state, now, now - ticket.started_at)
        ticket.event.set()

    def _pump(self, key: str, state: _KeyState, now: float) -> None:
        """Admit waiters from the head while there is room; wake the new head so that it
        waits on the clock if only the rate holds it back."""
        while state.waiters and self._next_start(state, now) <= now:
            self._grant(key, state, now)
        if state.waiters:
            state.waiters[0].event.set()

    def _release(self, admission: Admission) -> None:
        key = admission.key
        state = self._keys.get(key)
        if state is None:  # pragma: no cover - a held admission keeps its key's state
            return
        state.running -= 1
        now = self._cc.current_time()
        self._pump(key, state, now)
        self._drop_if_idle(key, state, now)

    def retry_after(self, key: str) -> float | None:
        """Seconds until `key` could start one more if nothing else started (None: unknown,
        it waits for a running one to end)."""
        state = self._keys.get(key)
        if state is None:
            return 0.0
        now = self._cc.current_time()
        at = self._next_start(state, now)
        return None if at == math.inf else max(at - now, 0.0)

    # -- keys ---------------------------------------------------------------------------------

    def _state(self, key: str) -> _KeyState:
        state = self._keys.get(key)
        if state is None:
            if len(self._keys) >= SWEEP_AT_KEYS:
                self._sweep()
            state = self._keys[key] = _KeyState()
        return state

    def _drop_if_idle(self, key: str, state: _KeyState, now: float) -> None:
        if state.idle(now, self._per):
            self._keys.pop(key, None)

    def _sweep(self) -> None:
        now = self._cc.current_time()
        for key, state in list(self._keys.items()):
            self._drop_if_idle(key, state, now)

    @property
    def keys_held(self) -> int:
        """How many keys the limiter keeps state for (running, waiting, or rate history)."""
        return len(self._keys)

    def stats(self, key: str | None = None) -> list[LimitStats]:
        """Per key (or for `key` alone): how many run and wait here."""
        limit = self.limit
        chosen = self._keys.items() if key is None else [(key, self._keys.get(key))]
        return [
            LimitStats(
                limit.name,
                limit.scope,
                k,
                state.running if state else 0,
                len(state.waiters) if state else 0,
                limit.concurrency,
                limit.rate,
                limit.per,
            )
            for k, state in chosen
        ]


def _nothing_to_release(_: Admission) -> None:
    pass
