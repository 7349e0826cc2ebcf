"""What a child tells its supervisor, as typed messages with one encode and one decode: over
the pipe (the ports it serves on, that it takes signals, that it reserves) and over its health
port (its health, as the monitor's data: `Health`, no sentence to parse). Each message is a
JSON array, its tag first (the supervisor never unpickles what a child sends)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..._worker.monitor import Health

# The tags, one per message type (as billiard tags what a pool's worker sends its parent).
PORTS = "ports"
TAKES_SIGNALS = "takes-signals"
RESERVING = "reserving"
HEALTH = "health"

HEALTH_PATH = "/fleet/health"  # on a child's health port: `Health` for the supervisor
HEALTH_CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class Ports:
    """The ports (on 127.0.0.1) a child serves its probes and its metrics on (None: not)."""

    health: int | None = None
    metrics: int | None = None


@dataclass(frozen=True, slots=True)
class TakesSignals:
    """The child catches SIGTERM now: the signals owed to it may be sent."""


@dataclass(frozen=True, slots=True)
class Reserving:
    """The child's worker reserves jobs (its key was accepted)."""

    worker_id: str


Message = Ports | TakesSignals | Reserving | Health


class MessageError(ValueError):
    """Bytes that are no message."""


def encode(message: Message) -> bytes:
    if isinstance(message, Ports):
        fields: list[object] = [PORTS, message.health, message.metrics]
    elif isinstance(message, TakesSignals):
        fields = [TAKES_SIGNALS]
    elif isinstance(message, Reserving):
        fields = [RESERVING, message.worker_id]
    else:
        fields = [HEALTH, message.live, message.ready, message.status, message.loop_lag]
    return json.dumps(fields, separators=(",", ":")).encode()


def decode(data: bytes) -> Message:
    try:
        fields = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MessageError(f"not JSON: {exc}") from None
    if not isinstance(fields, list) or not fields:
        raise MessageError(f"not a tagged message: {data[:100]!r}")
    tag, *values = fields
    if tag == PORTS and len(values) == 2 and all(_is_port(v) for v in values):
        return Ports(*values)
    if tag == TAKES_SIGNALS and not values:
        return TakesSignals()
    if tag == RESERVING and len(values) == 1 and isinstance(values[0], str):
        return Reserving(values[0])
    if tag == HEALTH and len(values) == 4:
        live, ready, status, lag = values
        if (
            isinstance(live, bool)
            and isinstance(ready, bool)
            and isinstance(status, str)
            and (lag is None or (_is_number(lag) and lag >= 0))
        ):
            return Health(live, ready, status, None if lag is None else float(lag))
    raise MessageError(f"not a message of this supervisor: {data[:100]!r}")


def _is_port(value: object) -> bool:
    return value is None or (type(value) is int and 0 < value < 65536)


def _is_number(value: object) -> bool:
    return type(value) in (int, float)
