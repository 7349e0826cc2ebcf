"""The relay's state as Prometheus text, served by the Worker's small HTTP responder."""

from __future__ import annotations

from collections.abc import Callable

from .._runtime.concurrency import TASK_STATUS_IGNORED, TaskStatus, running_library
from .._worker.http_responder import Responder
from .._worker.monitor import PROMETHEUS_TEXT
from .policy import RelayPolicy
from .store import Backlog


def render(table: str, policy: RelayPolicy, backlog: Backlog) -> str:
    c = policy.counters
    label = f'{{table="{table}"}}'
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
    out: list[str] = []
    for name, kind, help_text, value in series:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.append(
            f"{name}{label} {value:g}" if isinstance(value, float) else f"{name}{label} {value}"
        )
    return "\n".join(out) + "\n"


async def serve(
    text: Callable[[], str],
    port: int,
    *,
    host: str | None,
    task_status: TaskStatus[int] = TASK_STATUS_IGNORED,
) -> None:
    responder = Responder({"/metrics": lambda: (200, PROMETHEUS_TEXT, text().encode())})
    if running_library() == "trio":
        await responder.serve(port, host=host, task_status=task_status)
    else:
        from .._worker import anyio_http

        await anyio_http.serve(responder, port, host=host, task_status=task_status)
