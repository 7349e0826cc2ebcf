"""Time as global limits keep it: the server's clock as this process estimates it
(`ServerClock`), and the epochs every process cuts that clock into (`Epochs`; docs/limits.md,
"Epochs")."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from .._runtime.concurrency import ServiceRuntime
from .client_calls import LimitClient


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class ServerClock:
    """The server's wall clock, as an offset from ours measured with `get_server_info` (at the
    middle of the call's round trip), and the longest lease it grants. Leases, schedules and
    the epochs are all on the server's clock, so every process reads the same epoch from it
    within its estimate's error (the skew the epochs allow for)."""

    def __init__(
        self,
        client: LimitClient,
        cc: ServiceRuntime,
        wall: Callable[[], datetime] = utc_now,
    ) -> None:
        self._client = client
        self._cc = cc
        self._wall = wall
        self.offset_s = 0.0
        self.uncertainty_s = math.inf  # half the round trip of the last measurement
        self.max_lease_s: float | None = None

    async def sync(self) -> None:
        """Measure the offset (and the lease ceiling) again; keeps the old one on failure."""
        get_info = getattr(self._client, "get_server_info", None)
        if get_info is None:
            return  # a client without it: our own clock stands in (skew must cover it)
        before = self._wall()
        info = await get_info()
        after = self._wall()
        middle = before + (after - before) / 2
        self.offset_s = (info.server_time - middle).total_seconds()
        self.uncertainty_s = (after - before).total_seconds() / 2
        self.max_lease_s = info.max_lease_duration.total_seconds()

    def now(self) -> float:
        """The server's time now, in seconds since the epoch (Unix)."""
        return self._wall().timestamp() + self.offset_s

    def to_datetime(self, server_s: float) -> datetime:
        return datetime.fromtimestamp(server_s, timezone.utc)

    def local_deadline(self, server_s: float) -> float:
        """When the server's clock reads `server_s`, on the concurrency library's clock."""
        return self._cc.current_time() + (server_s - self.now())

    def granted_lease_s(self, requested_s: float) -> float:
        """What the server grants for `requested_s` (its ceiling, when known, clamps it)."""
        if self.max_lease_s is None:
            return requested_s
        return min(requested_s, self.max_lease_s)


@dataclass(frozen=True, slots=True)
class Epochs:
    """The server's clock cut into epochs of `length_s`: permits belong to one (docs/limits.md).

    `skew_s` is how far two processes' estimates of the server's clock may differ;
    `genesis_delay_s` how long after an epoch begins its permits may be made from nothing
    (after every holder of an older permit has claimed the new epoch's: `claim_s` after the
    start at the latest). Genesis stops `skew_s` before the epoch ends, so that no process
    makes an epoch's permits while another already hands over into the next one."""

    length_s: float
    skew_s: float
    claim_s: float

    @property
    def genesis_delay_s(self) -> float:
        return self.claim_s + 2 * self.skew_s

    def of(self, server_s: float) -> int:
        return math.floor(server_s / self.length_s)

    def start(self, epoch: int) -> float:
        return epoch * self.length_s

    def genesis_opens(self, epoch: int) -> float:
        return self.start(epoch) + self.genesis_delay_s

    def genesis_closes(self, epoch: int) -> float:
        return self.start(epoch + 1) - self.skew_s

    def genesis_open(self, server_s: float) -> bool:
        epoch = self.of(server_s)
        return self.genesis_opens(epoch) <= server_s < self.genesis_closes(epoch)

    def claim_deadline(self, epoch: int) -> float:
        """By when a holder of an older permit must have claimed `epoch`'s (else it stops)."""
        return self.start(epoch) + self.claim_s + self.skew_s

    def next_genesis_window(self, server_s: float) -> float:
        """The server time genesis is next allowed (now, if it is)."""
        if self.genesis_open(server_s):
            return server_s
        epoch = self.of(server_s)
        opens = self.genesis_opens(epoch)
        return opens if server_s < opens else self.genesis_opens(epoch + 1)


DEFAULT_EPOCH_S = 600.0
DEFAULT_SKEW_S = 1.0


def epochs_for(
    *,
    lease_s: float,
    per_s: float | None,
    epoch_s: float | None = None,
    skew_s: float = DEFAULT_SKEW_S,
) -> Epochs:
    """The epochs of a global limit: long against its lease and window (a rate's cooldown
    crosses at most one boundary; a holder claims once per boundary), well inside the server's
    dedup window (24 h by default)."""
    claim_s = lease_s / 3 + skew_s  # a holder tries at the boundary, and while its lease holds
    floor_s = max(4 * lease_s, 2 * (per_s or 0.0) + 4 * (claim_s + 2 * skew_s))
    length_s = max(DEFAULT_EPOCH_S if epoch_s is None else epoch_s, floor_s)
    return Epochs(length_s, skew_s, claim_s)
