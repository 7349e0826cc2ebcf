"""The relay's state as Prometheus families, written by `_probes.prometheus` and served by
`_probes.server` (from a thread: under trio, asyncio and `run_sync` alike)."""

from __future__ import annotations

from collections.abc import Callable

from .._probes import prometheus
from .._probes.http1 import Route
from .policy import RelayPolicy
from .store import Backlog


def render(table: str, policy: RelayPolicy, backlog: Backlog) -> str:
    c = policy.counters
    series = (
        ("sepp_outbox_waiting", "gauge", "Rows waiting to be relayed.", backlog.waiting),
        (
            "sepp_outbox_oldest_age_seconds",
            "gauge",
            "Age of the oldest row waiting (0 when none).",
            backlog.oldest_age_s,
        ),
        ("sepp_outbox_rejected_rows", "gauge", "Rows kept as rejected.", backlog.rejected),
        ("sepp_outbox_relayed_total", "counter", "Jobs the server accepted.", c.relayed),
        (
            "sepp_outbox_deduplicated_total",
            "counter",
            "Jobs the server already had (resent after a crash or a lost answer).",
            c.deduplicated,
        ),
        ("sepp_outbox_rejected_total", "counter", "Jobs the server rejected.", c.rejected),
        (
            "sepp_outbox_send_failures_total",
            "counter",
            "Batches the server did not answer.",
            c.send_failures,
        ),
        (
            "sepp_outbox_db_failures_total",
            "counter",
            "Database calls that failed.",
            c.db_failures,
        ),
        (
            "sepp_outbox_failures_in_a_row",
            "gauge",
            "Consecutive failed tries (0: healthy).",
            policy.failures_in_a_row,
        ),
    )
    families = []
    for name, kind, help_text, value in series:
        family = prometheus.Family(name, kind, help_text)
        family.add(value, table=table)
        families.append(family)
    return prometheus.write(families)


def route(text: Callable[[], str]) -> dict[str, Route]:
    """The relay's one path."""
    return {"/metrics": lambda: (200, prometheus.CONTENT_TYPE, text().encode())}
