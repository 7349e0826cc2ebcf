"""The memory server's configuration: the TOML the real server reads (as a mapping, TOML text
or a file), checked as sepp 0.1.1 checks it at startup, resolved into the limits each queue
gets (its `[[queues]]` entry over `[limits]`).

What only a process with a disk or a network has (`db_path`, `persist_mode`, TLS, the admin
UI, metrics, tracing) is accepted and has no effect, except TLS, which the memory server does
not serve: a config that asks for it is refused rather than served in plain text."""

from __future__ import annotations

import os
import tomllib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._config_schema import config_problem

ConfigSource = Mapping[str, object] | str | os.PathLike[str] | None

DEFAULT_LISTEN_ADDR = "0.0.0.0:50051"
# The HTTP/2 sides: our codec (the default) and the reference on h2, as the client has.
WIRE_ENGINES = ("codec", "h2")


def queue_name_problem(name: str) -> str | None:
    """Why `name` cannot be a queue (the server's rule for requests and for its config)."""
    if not name:
        return "must not be empty"
    if name in (".", ".."):
        return 'must not be "." or ".."'
    if "/" in name:
        return "must not contain '/'"
    if any(unicodedata.category(char) == "Cc" for char in name):
        return "must not contain control characters"
    return None


class ConfigError(ValueError):
    """The config is one the real server would refuse to start with (or one that needs what
    the memory server does not do, TLS)."""


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """What one queue gets: `[limits]` with its `[[queues]]` entry's overrides."""

    max_lease_duration_ms: int = 300_000
    default_max_attempts: int = 3
    max_attempts_ceiling: int = 100
    default_priority: int = 0
    retry_delay_ms: int = 0
    retry_backoff: str = "none"
    retry_delay_max_ms: int = 3_600_000
    max_payload_bytes: int = 1 << 20
    allowed_encodings: tuple[str, ...] | None = None
    allowed_job_types: tuple[str, ...] | None = None
    max_schedule_horizon_ms: int = 30 * 24 * 3_600_000
    max_custom_entries: int = 64
    max_custom_total_bytes: int = 16 << 10
    max_custom_key_bytes: int = 256
    dedup_window_ms: int = 86_400_000
    max_queue_depth: int | None = None


# The keys a `[[queues]]` entry may override (allowed_job_types exists only there).
_OVERRIDABLE = (
    "max_lease_duration_ms",
    "default_max_attempts",
    "max_attempts_ceiling",
    "default_priority",
    "retry_delay_ms",
    "retry_backoff",
    "retry_delay_max_ms",
    "max_payload_bytes",
    "allowed_encodings",
    "max_schedule_horizon_ms",
    "max_custom_entries",
    "max_custom_total_bytes",
    "max_custom_key_bytes",
    "dedup_window_ms",
    "max_queue_depth",
)
_LIST_KEYS = ("allowed_encodings", "allowed_job_types")


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    strict_queues: bool = False
    api_keys: frozenset[str] | None = None  # None: no auth; empty: every call refused
    defaults: QueueLimits = QueueLimits()
    queues: Mapping[str, QueueLimits] = field(default_factory=dict)
    max_reserve_batch: int = 256
    max_reserve_queues: int = 32
    max_wait_timeout_ms: int = 300_000
    max_enqueue_batch: int = 256
    max_message_bytes: int = 16 << 20
    max_queue_name_bytes: int = 512
    max_job_type_bytes: int = 256
    max_idempotency_key_bytes: int = 256
    sweep_limit: int = 10_000
    dead_letter_retention_ms: int = 0
    listen_addr: str = DEFAULT_LISTEN_ADDR

    def limits(self, queue: str) -> QueueLimits:
        return self.queues.get(queue, self.defaults)

    @property
    def min_max_lease_ms(self) -> int:
        """The smallest lease ceiling of any queue: a lease at or under it is never clamped."""
        return min([self.defaults.max_lease_duration_ms] + [
            q.max_lease_duration_ms for q in self.queues.values()
        ])  # fmt: skip

    @property
    def any_retry_policy(self) -> bool:
        return self.defaults.retry_delay_ms > 0 or any(
            q.retry_delay_ms > 0 for q in self.queues.values()
        )


def load_config(source: ConfigSource) -> MemoryConfig:
    """`source` as a MemoryConfig: a mapping (as `sepp.testing.sepp_server` takes), TOML text,
    or the path of a TOML file; None is the defaults. Raises ConfigError."""
    return parse_config(read_config(source))


def read_config(source: ConfigSource) -> dict[str, Any]:
    if source is None:
        return {}
    if isinstance(source, Mapping):
        return {key: value for key, value in source.items()}
    try:
        text = (
            Path(source).read_text(encoding="utf-8") if isinstance(source, os.PathLike) else source
        )
        return tomllib.loads(text)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the sepp config: {exc}") from exc


def _without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_without_none(item) for item in value]
    return value


def parse_config(raw: Mapping[str, Any]) -> MemoryConfig:
    problem = config_problem(raw)
    if problem is not None:
        raise ConfigError(f"{problem} (sepp 0.1.1)")
    config: dict[str, Any] = _without_none(raw)
    server = config.get("server", {})
    limits = config.get("limits", {})
    storage = config.get("storage", {})
    if server.get("tls_cert_path") or server.get("tls_key_path"):
        raise ConfigError(
            "the memory server does not serve TLS (server.tls_cert_path / tls_key_path): "
            "test TLS against the real server"
        )
    _check_ranges("limits", limits, _LIMIT_RANGES)
    _check_ranges("storage", storage, _STORAGE_RANGES)
    given = {key: limits[key] for key in _OVERRIDABLE if key in limits and key in _GLOBAL}
    if "dedup_window_ms" in storage:
        given["dedup_window_ms"] = storage["dedup_window_ms"]
    defaults = QueueLimits(**given)
    defaults = _tuples(defaults)
    max_message_bytes = limits.get("max_message_bytes", 16 << 20)
    _check_limits("limits", defaults, max_message_bytes)
    max_queue_name_bytes = limits.get("max_queue_name_bytes", 512)
    queues: dict[str, QueueLimits] = {}
    for entry in config.get("queues", []):
        name = entry.get("name", "")
        why = queue_name_problem(name)
        if why is not None:
            raise ConfigError(f"queues[].name {name!r} {why}")
        if len(name.encode("utf-8")) > max_queue_name_bytes:
            raise ConfigError(
                f"queues[].name {name!r} exceeds limits.max_queue_name_bytes "
                f"({max_queue_name_bytes})"
            )
        if name in queues:
            raise ConfigError(f"queues[] contains duplicate name {name!r}")
        overrides = {
            key: entry[key] for key in (*_OVERRIDABLE, "allowed_job_types") if key in entry
        }
        merged = _tuples(replace(defaults, **{"allowed_job_types": None, **overrides}))
        _check_limits(f"queues[{name!r}]", merged, max_message_bytes)
        queues[name] = merged
    return MemoryConfig(
        strict_queues=bool(server.get("strict_queues", False)),
        api_keys=_api_keys(config.get("auth", {})),
        defaults=defaults,
        queues=queues,
        max_reserve_batch=limits.get("max_reserve_batch", 256),
        max_reserve_queues=limits.get("max_reserve_queues", 32),
        max_wait_timeout_ms=limits.get("max_wait_timeout_ms", 300_000),
        max_enqueue_batch=limits.get("max_enqueue_batch", 256),
        max_message_bytes=max_message_bytes,
        max_queue_name_bytes=max_queue_name_bytes,
        max_job_type_bytes=limits.get("max_job_type_bytes", 256),
        max_idempotency_key_bytes=limits.get("max_idempotency_key_bytes", 256),
        sweep_limit=storage.get("sweep_limit", 10_000),
        dead_letter_retention_ms=storage.get("dead_letter_retention_ms", 0),
        listen_addr=server.get("listen_addr", DEFAULT_LISTEN_ADDR),
    )


# `[limits]` keys that are also a queue's (dedup_window_ms is `[storage]`'s globally).
_GLOBAL = frozenset(_OVERRIDABLE) - {"dedup_window_ms"}

# Lower (and upper) bounds the server puts on single keys.
_LIMIT_RANGES: dict[str, tuple[int, int | None]] = {
    "max_reserve_batch": (1, None),
    "max_reserve_queues": (1, None),
    "max_wait_timeout_ms": (1, None),
    "max_enqueue_batch": (1, None),
    "max_message_bytes": (1, None),
    "max_queue_name_bytes": (1, 65535),
    "max_job_type_bytes": (1, None),
    "max_idempotency_key_bytes": (1, None),
}
_STORAGE_RANGES: dict[str, tuple[int, int | None]] = {
    "sweep_interval_ms": (1, None),
    "sweep_limit": (1, None),
    "command_queue_capacity": (1, None),
    "cache_size_bytes": (1, None),
    "max_journaling_size_bytes": (64 * 1024 * 1024, None),
    "max_cached_files": (10, None),
    "worker_threads": (1, None),
}
_QUEUE_MINIMUM_ONE = (
    "max_lease_duration_ms",
    "default_max_attempts",
    "max_attempts_ceiling",
    "retry_delay_max_ms",
    "max_payload_bytes",
    "max_schedule_horizon_ms",
    "max_custom_entries",
    "max_custom_total_bytes",
    "max_custom_key_bytes",
    "dedup_window_ms",
)


def _check_ranges(
    section: str, table: Mapping[str, Any], ranges: dict[str, tuple[int, int | None]]
) -> None:
    for key, (low, high) in ranges.items():
        value = table.get(key)
        if value is None:
            continue
        if value < low:
            raise ConfigError(f"{section}.{key}: lower than {low}")
        if high is not None and value > high:
            raise ConfigError(f"{section}.{key}: greater than {high}")


def _tuples(limits: QueueLimits) -> QueueLimits:
    changes: dict[str, Any] = {
        key: tuple(getattr(limits, key))
        for key in _LIST_KEYS
        if getattr(limits, key) is not None and not isinstance(getattr(limits, key), tuple)
    }
    return replace(limits, **changes) if changes else limits


def _check_limits(scope: str, limits: QueueLimits, max_message_bytes: int) -> None:
    for key in _QUEUE_MINIMUM_ONE:
        if getattr(limits, key) < 1:
            raise ConfigError(f"{scope}: {key}: lower than 1")
    if limits.default_priority > 9:
        raise ConfigError(f"{scope}: default_priority: greater than 9")
    if limits.max_payload_bytes > max_message_bytes:
        raise ConfigError(f"{scope}: max_payload_bytes: must not exceed limits.max_message_bytes")
    if limits.allowed_encodings is not None and any(not e for e in limits.allowed_encodings):
        raise ConfigError(f"{scope}: allowed_encodings: an entry is empty")
    if limits.allowed_job_types is not None and (
        not limits.allowed_job_types or any(not t for t in limits.allowed_job_types)
    ):
        raise ConfigError(f"{scope}: allowed_job_types: must list at least one non-empty type")
    if limits.default_max_attempts > limits.max_attempts_ceiling:
        raise ConfigError(f"{scope}.default_max_attempts: must not exceed max_attempts_ceiling")
    if limits.retry_delay_ms > limits.retry_delay_max_ms:
        raise ConfigError(f"{scope}.retry_delay_ms: must not exceed retry_delay_max_ms")


def _api_keys(auth: Mapping[str, Any]) -> frozenset[str] | None:
    entries = auth.get("api_keys")
    if entries is None:
        return None
    names: set[str] = set()
    keys: set[str] = set()
    for entry in entries:
        name, key = entry.get("name", ""), entry.get("key", "")
        if not name:
            raise ConfigError("auth.api_keys[].name must not be empty")
        if not key:
            raise ConfigError(f"API key {name!r} has an empty key")
        if not all(0x21 <= ord(char) <= 0x7E for char in key):
            raise ConfigError(f"API key {name!r} must be visible ASCII")
        if name in names:
            raise ConfigError(f"auth.api_keys has a duplicate name {name!r}")
        if key in keys:
            raise ConfigError(f"API keys {name!r} and another share the same key")
        names.add(name)
        keys.add(key)
    return frozenset(keys)
