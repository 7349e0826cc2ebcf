"""`--task MODULE:ATTR`: a `sepp.Task` whose payload type checks JSON before it is sent."""

from __future__ import annotations

from typing import Any

import sepp

from ._targets import load_target


def load_task(spec: str) -> sepp.Task[Any]:
    """The Task `spec` names (a UsageError if it names something else)."""
    return load_target(spec, sepp.Task, "a sepp.Task")


def typed_payload(task: sepp.Task[Any], document: object) -> sepp.Payload:
    """`document` (parsed JSON) checked against the task's type and encoded by its codec;
    raises PayloadDecodeError naming the first problem."""
    checked = task.decode(sepp.Payload.json(document))
    return task.encode(checked)
