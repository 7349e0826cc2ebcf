"""The configuration keys and value types that the tested sepp server version reads.

The server ignores unknown keys in most sections (a misspelled limit silently keeps its
default) and reports a wrong type as a raw deserialiser dump, so the test helpers check a
config against this table first and say which key is wrong and what it expects.
Read off sepp 0.1.1's configuration structs (its `config.rs`); keep it in step with
`SEPP_SERVER_VERSION`.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Mapping, Sequence

# A value type: a name for messages and a predicate.
ValueType = tuple[str, Callable[[object], bool]]


def _int_in(low: int, high: int) -> Callable[[object], bool]:
    return lambda value: (
        isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    )


def _is_float(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not isinstance(value, float) or not math.isnan(value)


def _is_socket_address(value: object) -> bool:
    if not isinstance(value, str):
        return False
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        return False
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)  # a literal IP: the server parses a SocketAddr
    except ValueError:
        return False
    return True


def _one_of(*choices: str) -> ValueType:
    return (f"one of {', '.join(map(repr, choices))}", lambda value: value in choices)


def _str_list(value: object) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and all(isinstance(item, str) for item in value)
    )


# TOML integers are signed 64-bit, so an unsigned 64-bit field takes 0 to 2**63 - 1 here.
U32: ValueType = ("an integer from 0 to 4294967295", _int_in(0, 2**32 - 1))
U64: ValueType = ("a non-negative integer", _int_in(0, 2**63 - 1))
I64: ValueType = ("an integer", _int_in(-(2**63), 2**63 - 1))
BOOL: ValueType = ("a boolean", lambda value: isinstance(value, bool))
STR: ValueType = ("a string", lambda value: isinstance(value, str))
F64: ValueType = ("a number", _is_float)
ADDRESS: ValueType = ('an "IP:PORT" string', _is_socket_address)
STR_LIST: ValueType = ("a list of strings", _str_list)

# A table's keys: a value type, or a nested table schema for an array of tables.
Table = Mapping[str, "ValueType | TableList"]


class TableList:
    """An array of tables (`[[queues]]`, `api_keys = [{...}]`), each checked against `keys`."""

    __slots__ = ("keys",)

    def __init__(self, keys: Table) -> None:
        self.keys = keys


_QUEUE_LIMITS: dict[str, ValueType | TableList] = {
    "max_lease_duration_ms": U64,
    "default_max_attempts": U32,
    "max_attempts_ceiling": U32,
    "default_priority": U32,
    "retry_delay_ms": U64,
    "retry_backoff": _one_of("none", "exponential"),
    "retry_delay_max_ms": U64,
    "max_payload_bytes": U64,
    "allowed_encodings": STR_LIST,
    "max_schedule_horizon_ms": U64,
    "max_custom_entries": U32,
    "max_custom_total_bytes": U64,
    "max_custom_key_bytes": U32,
    "max_queue_depth": U64,
}

SCHEMA: Mapping[str, Table | TableList] = {
    "server": {
        "listen_addr": ADDRESS,
        "db_path": STR,
        "tls_cert_path": STR,
        "tls_key_path": STR,
        "strict_queues": BOOL,
    },
    "auth": {"api_keys": TableList({"name": STR, "key": STR})},
    "limits": {
        **_QUEUE_LIMITS,
        "max_reserve_batch": U32,
        "max_reserve_queues": U32,
        "max_wait_timeout_ms": U64,
        "max_enqueue_batch": U32,
        "max_message_bytes": U64,
        "max_queue_name_bytes": U32,
        "max_job_type_bytes": U32,
        "max_idempotency_key_bytes": U32,
    },
    "storage": {
        "persist_mode": _one_of("sync_all", "sync_data", "buffer"),
        "sweep_interval_ms": U64,
        "sweep_limit": U64,
        "dedup_window_ms": I64,
        "dead_letter_retention_ms": U64,
        "command_queue_capacity": U64,
        "cache_size_bytes": U64,
        "max_journaling_size_bytes": U64,
        "max_cached_files": U64,
        "worker_threads": U64,
    },
    "logging": {"level": STR, "format": _one_of("text", "json")},
    "tracing": {"enabled": BOOL, "otlp_endpoint": STR, "service_name": STR, "sample_ratio": F64},
    "metrics": {
        "enabled": BOOL,
        "otlp_endpoint": STR,
        "export_interval_ms": U64,
        "prometheus_enabled": BOOL,
        "prometheus_listen_addr": ADDRESS,
    },
    "admin": {
        "enabled": BOOL,
        "listen_addr": ADDRESS,
        "tls_cert_path": STR,
        "tls_key_path": STR,
        "keys": TableList(
            {"name": STR, "key": STR, "role": _one_of("viewer", "operator", "admin")}
        ),
        "session_ttl_ms": U64,
        "stats_history_ms": U64,
    },
    "queues": TableList(
        {
            "name": STR,
            **_QUEUE_LIMITS,
            "allowed_job_types": STR_LIST,
            "dedup_window_ms": I64,
        }
    ),
}


def config_problem(config: Mapping[str, object]) -> str | None:
    """What is wrong with `config` for the tested server version, or None. `None` values
    are fine anywhere: the TOML writer leaves those keys out."""
    return _table_problem(config, SCHEMA, "")


def _table_problem(
    table: Mapping[str, object], schema: Mapping[str, object], at: str
) -> str | None:
    for key, value in table.items():
        where = f"{at}{key}"
        if value is None:
            continue
        expected = schema.get(key)
        if expected is None:
            known = ", ".join(sorted(schema))
            return f"unknown config key {where!r}; {at[:-1] or 'the top level'} has: {known}"
        problem = _value_problem(value, expected, where)
        if problem is not None:
            return problem
    return None


def _value_problem(value: object, expected: object, where: str) -> str | None:
    if isinstance(expected, TableList):
        if isinstance(value, Mapping) or isinstance(value, str) or not isinstance(value, Sequence):
            return f"config key {where!r} must be a list of tables, got {type(value).__name__}"
        for index, item in enumerate(value):
            if not isinstance(item, Mapping):
                return f"config key {where}[{index}] must be a table, got {type(item).__name__}"
            problem = _table_problem(item, expected.keys, f"{where}[{index}].")
            if problem is not None:
                return problem
        return None
    if isinstance(expected, Mapping):
        if not isinstance(value, Mapping):
            return f"config key {where!r} must be a table, got {type(value).__name__}"
        return _table_problem(value, expected, f"{where}.")
    assert isinstance(expected, tuple)
    name: str = expected[0]
    accepts: Callable[[object], bool] = expected[1]
    if not accepts(value):
        return f"config key {where!r} must be {name}, got {value!r}"
    return None
