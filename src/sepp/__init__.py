"""sepp-trio: a pure-Python client for the sepp durable job queue, trio-native, with the same
`Client`, `Worker` and `Scheduler` on asyncio (uvloop too) and a blocking `SyncClient`.

The package is built in layers, each a folder that imports only the layers below it
(tests/unit/test_module_structure.py holds this; docs/contributing.md draws it):

- `_util/`: lazy imports and the logging adaptor, for every layer; beside it `_probes/`, what
  a process tells the outside when asked: the one HTTP server for probes and metrics (a thread
  of its own, for every front end) and the Prometheus text format;
- `wire/`: gRPC over HTTP/2 with no domain types: the shared sans-IO pieces, the engines
  (`codec/`, ours and the default; `h2ref/`, the reference on h2) and the `drivers/` that give
  them sockets, one per front end (trio, asyncio, blocking) on a core that holds the rest;
- `_model/`: the values users handle, errors, rejections, validation, the one backoff,
  message conversion;
- `_runtime/`: the one seam to the library the code runs on: the protocols (cancel scopes,
  task groups, events) and one runtime per library (trio, asyncio with anyio for the
  services, blocking for the client alone), for the client, the Worker and the Scheduler;
- `_client/`: the operations (written once), `Client`, `SyncClient`, batching, local limits,
  retries, options;
- `_limits/`: `Limit` and the limiters the Worker admits handlers through (in one process, or
  across the fleet on the server's own primitives), and deferring a job without an attempt;
- `_payloads/`: payload codecs and typed tasks;
- the services, which never import each other: `_worker/` (`Worker`, `Router`, handlers,
  middleware, lease keeping, the monitor), `_scheduling/` (`Schedule` and `Scheduler`) and
  `_outbox/` (`Outbox`, jobs written in the application's database transaction, and
  `OutboxRelay`, which forwards them);
- `_cli/` (the `sepp-trio` command), `testing/` (public: servers for tests, the real one
  and a pure-Python one in memory, `testing/_memory/`) and `contrib/` (public: integrations
  with other services, each behind an extra, e.g. `sepp.contrib.sentry`) on top.

The public API is the table below, and nothing else: every name in it presents as `sepp.X`.
"""

from __future__ import annotations

import inspect
from importlib import import_module
from typing import TYPE_CHECKING

EAGER, LAZY = True, False
# Every public name: (its module, relative to this package; whether `import sepp` loads it).
# Lazy ones load on first use, so that `import sepp` stays cheap for code that only enqueues:
# the Worker, Router and Scheduler machinery (and zoneinfo, which schedules need), the
# rejection reasons (15 dataclasses, created when a rejection first appears), typed tasks and
# codecs, and the blocking client. `__all__` and `__getattr__` come from it; the imports for
# type checkers below repeat it (tests/unit/test_lazy_imports.py checks they agree).
_PUBLIC: dict[str, tuple[str, bool]] = {
    "Batching": ("_client.batching", EAGER),
    "Client": ("_client.client", EAGER),
    "DEFAULT_MAX_RECEIVE_MESSAGE_BYTES": ("_client.client", EAGER),
    "open": ("_client.client", EAGER),
    "RetryPolicy": ("_client.retry", EAGER),
    "Backoff": ("_model.backoff", EAGER),
    "AttemptMismatchError": ("_model.errors", EAGER),
    "BatchValidationError": ("_model.errors", EAGER),
    "ClientError": ("_model.errors", EAGER),
    "ConnectError": ("_model.errors", EAGER),
    "InvalidRequestError": ("_model.errors", EAGER),
    "JobFailedError": ("_model.errors", EAGER),
    "JobNotFoundError": ("_model.errors", EAGER),
    "JobRejectedError": ("_model.errors", EAGER),
    "LeaseError": ("_model.errors", EAGER),
    "MalformedResponseError": ("_model.errors", EAGER),
    "MessageTooLargeError": ("_model.errors", EAGER),
    "OverloadedError": ("_model.errors", EAGER),
    "ResultError": ("_model.errors", EAGER),
    "ResultTimeoutError": ("_model.errors", EAGER),
    "ResultUnavailableError": ("_model.errors", EAGER),
    "SeppError": ("_model.errors", EAGER),
    "ServerInternalError": ("_model.errors", EAGER),
    "TransportError": ("_model.errors", EAGER),
    "UnauthenticatedError": ("_model.errors", EAGER),
    "UnexpectedStatusError": ("_model.errors", EAGER),
    "UnknownQueuesError": ("_model.errors", EAGER),
    "ValidationError": ("_model.errors", EAGER),
    "JobRejection": ("_model.rejections", EAGER),
    "is_job_rejection": ("_model.rejections", EAGER),
    "BatchRejection": ("_model.rejections", EAGER),
    "DeadLetterCause": ("_model.types", EAGER),
    "DeadLetterRecord": ("_model.types", EAGER),
    "EnqueueAck": ("_model.types", EAGER),
    "EnqueueRequest": ("_model.types", EAGER),
    "Job": ("_model.types", EAGER),
    "JobContext": ("_model.types", EAGER),
    "Payload": ("_model.types", EAGER),
    "Retry": ("_model.types", EAGER),
    "ServerInfo": ("_model.types", EAGER),
    "TraceContext": ("_model.types", EAGER),
    "__version__": ("_version", EAGER),
    "StatusCode": ("wire", EAGER),
    "SyncClient": ("_client.sync", LAZY),
    "connect": ("_client.sync", LAZY),
    "CustomEntriesTooMany": ("_model.rejection_reasons", LAZY),
    "CustomKeyTooLong": ("_model.rejection_reasons", LAZY),
    "CustomMapTooLarge": ("_model.rejection_reasons", LAZY),
    "EncodingNotAllowed": ("_model.rejection_reasons", LAZY),
    "IdempotencyKeyTooLong": ("_model.rejection_reasons", LAZY),
    "InvalidRequest": ("_model.rejection_reasons", LAZY),
    "JobTypeNameTooLong": ("_model.rejection_reasons", LAZY),
    "JobTypeNotAllowed": ("_model.rejection_reasons", LAZY),
    "PayloadTooLarge": ("_model.rejection_reasons", LAZY),
    "QueueClosing": ("_model.rejection_reasons", LAZY),
    "QueueFull": ("_model.rejection_reasons", LAZY),
    "QueueNameTooLong": ("_model.rejection_reasons", LAZY),
    "ScheduledTooFar": ("_model.rejection_reasons", LAZY),
    "UnknownQueue": ("_model.rejection_reasons", LAZY),
    "UnknownRejection": ("_model.rejection_reasons", LAZY),
    "describe_job_rejection": ("_model.rejection_reasons", LAZY),
    "JsonCodec": ("_payloads.codecs", LAZY),
    "MsgspecCodec": ("_payloads.codecs", LAZY),
    "PayloadCodec": ("_payloads.codecs", LAZY),
    "PayloadDecodeError": ("_payloads.codecs", LAZY),
    "PydanticCodec": ("_payloads.codecs", LAZY),
    "Task": ("_payloads.task", LAZY),
    "TaskJob": ("_payloads.task", LAZY),
    "Chain": ("_payloads.pipelines", LAZY),
    "Group": ("_payloads.pipelines", LAZY),
    "chain": ("_payloads.pipelines", LAZY),
    "group": ("_payloads.pipelines", LAZY),
    "ResultHandle": ("_payloads.handles", LAZY),
    "SyncResultHandle": ("_payloads.handles", LAZY),
    "Schedule": ("_scheduling.schedule", LAZY),
    "Scheduler": ("_scheduling.scheduler", LAZY),
    "Limit": ("_limits.limit", LAZY),
    "LimitStats": ("_model.limit_stats", LAZY),
    "CallNext": ("_worker.middleware", LAZY),
    "DeadLetterHook": ("_worker.dead_letter_hooks", LAZY),
    "Middleware": ("_worker.middleware", LAZY),
    "WorkerMonitor": ("_worker.monitor", LAZY),
    "DuplicateHandlerError": ("_worker.router", LAZY),
    "Handler": ("_worker.router", LAZY),
    "Router": ("_worker.router", LAZY),
    "SyncJobContext": ("_worker.thread_handlers", LAZY),
    "ShutdownHandle": ("_runtime.shutdown_handle", LAZY),
    "HandlerError": ("_model.settlement", LAZY),
    "Worker": ("_worker.worker", LAZY),
    "Outbox": ("_outbox.outbox", LAZY),
    "OutboxRelay": ("_outbox.relay", LAZY),
}

if TYPE_CHECKING:
    from ._client.batching import Batching as Batching
    from ._client.client import (
        DEFAULT_MAX_RECEIVE_MESSAGE_BYTES as DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
    )
    from ._client.client import Client as Client
    from ._client.client import open as open
    from ._client.retry import RetryPolicy as RetryPolicy
    from ._client.sync import SyncClient as SyncClient
    from ._client.sync import connect as connect
    from ._limits.limit import Limit as Limit
    from ._model.backoff import Backoff as Backoff
    from ._model.errors import AttemptMismatchError as AttemptMismatchError
    from ._model.errors import BatchValidationError as BatchValidationError
    from ._model.errors import ClientError as ClientError
    from ._model.errors import ConnectError as ConnectError
    from ._model.errors import InvalidRequestError as InvalidRequestError
    from ._model.errors import JobFailedError as JobFailedError
    from ._model.errors import JobNotFoundError as JobNotFoundError
    from ._model.errors import JobRejectedError as JobRejectedError
    from ._model.errors import LeaseError as LeaseError
    from ._model.errors import MalformedResponseError as MalformedResponseError
    from ._model.errors import MessageTooLargeError as MessageTooLargeError
    from ._model.errors import OverloadedError as OverloadedError
    from ._model.errors import ResultError as ResultError
    from ._model.errors import ResultTimeoutError as ResultTimeoutError
    from ._model.errors import ResultUnavailableError as ResultUnavailableError
    from ._model.errors import SeppError as SeppError
    from ._model.errors import ServerInternalError as ServerInternalError
    from ._model.errors import TransportError as TransportError
    from ._model.errors import UnauthenticatedError as UnauthenticatedError
    from ._model.errors import UnexpectedStatusError as UnexpectedStatusError
    from ._model.errors import UnknownQueuesError as UnknownQueuesError
    from ._model.errors import ValidationError as ValidationError
    from ._model.limit_stats import LimitStats as LimitStats
    from ._model.rejection_reasons import CustomEntriesTooMany as CustomEntriesTooMany
    from ._model.rejection_reasons import CustomKeyTooLong as CustomKeyTooLong
    from ._model.rejection_reasons import CustomMapTooLarge as CustomMapTooLarge
    from ._model.rejection_reasons import EncodingNotAllowed as EncodingNotAllowed
    from ._model.rejection_reasons import IdempotencyKeyTooLong as IdempotencyKeyTooLong
    from ._model.rejection_reasons import InvalidRequest as InvalidRequest
    from ._model.rejection_reasons import JobTypeNameTooLong as JobTypeNameTooLong
    from ._model.rejection_reasons import JobTypeNotAllowed as JobTypeNotAllowed
    from ._model.rejection_reasons import PayloadTooLarge as PayloadTooLarge
    from ._model.rejection_reasons import QueueClosing as QueueClosing
    from ._model.rejection_reasons import QueueFull as QueueFull
    from ._model.rejection_reasons import QueueNameTooLong as QueueNameTooLong
    from ._model.rejection_reasons import ScheduledTooFar as ScheduledTooFar
    from ._model.rejection_reasons import UnknownQueue as UnknownQueue
    from ._model.rejection_reasons import UnknownRejection as UnknownRejection
    from ._model.rejection_reasons import describe_job_rejection as describe_job_rejection
    from ._model.rejections import BatchRejection as BatchRejection
    from ._model.rejections import JobRejection as JobRejection
    from ._model.rejections import is_job_rejection as is_job_rejection
    from ._model.settlement import HandlerError as HandlerError
    from ._model.types import DeadLetterCause as DeadLetterCause
    from ._model.types import DeadLetterRecord as DeadLetterRecord
    from ._model.types import EnqueueAck as EnqueueAck
    from ._model.types import EnqueueRequest as EnqueueRequest
    from ._model.types import Job as Job
    from ._model.types import JobContext as JobContext
    from ._model.types import Payload as Payload
    from ._model.types import Retry as Retry
    from ._model.types import ServerInfo as ServerInfo
    from ._model.types import TraceContext as TraceContext
    from ._outbox.outbox import Outbox as Outbox
    from ._outbox.relay import OutboxRelay as OutboxRelay
    from ._payloads.codecs import JsonCodec as JsonCodec
    from ._payloads.codecs import MsgspecCodec as MsgspecCodec
    from ._payloads.codecs import PayloadCodec as PayloadCodec
    from ._payloads.codecs import PayloadDecodeError as PayloadDecodeError
    from ._payloads.codecs import PydanticCodec as PydanticCodec
    from ._payloads.handles import ResultHandle as ResultHandle
    from ._payloads.handles import SyncResultHandle as SyncResultHandle
    from ._payloads.pipelines import Chain as Chain
    from ._payloads.pipelines import Group as Group
    from ._payloads.pipelines import chain as chain
    from ._payloads.pipelines import group as group
    from ._payloads.task import Task as Task
    from ._payloads.task import TaskJob as TaskJob
    from ._runtime.shutdown_handle import ShutdownHandle as ShutdownHandle
    from ._scheduling.schedule import Schedule as Schedule
    from ._scheduling.scheduler import Scheduler as Scheduler
    from ._version import __version__ as __version__
    from ._worker.dead_letter_hooks import DeadLetterHook as DeadLetterHook
    from ._worker.middleware import CallNext as CallNext
    from ._worker.middleware import Middleware as Middleware
    from ._worker.monitor import WorkerMonitor as WorkerMonitor
    from ._worker.router import DuplicateHandlerError as DuplicateHandlerError
    from ._worker.router import Handler as Handler
    from ._worker.router import Router as Router
    from ._worker.thread_handlers import SyncJobContext as SyncJobContext
    from ._worker.worker import Worker as Worker
    from .wire import StatusCode as StatusCode

__all__ = sorted(_PUBLIC)


def _present_as_sepp(value: object) -> None:
    # Reprs, tracebacks and the docs say `sepp.Client`, not where the class happens to live.
    # Only our own classes and functions: not type aliases (CallNext), not foreign objects.
    if isinstance(value, type) or inspect.isfunction(value):
        if value.__module__.startswith(f"{__name__}."):
            value.__module__ = __name__


for _name, (_module, _eager) in _PUBLIC.items():
    if _eager:
        _value = getattr(import_module(f".{_module}", __name__), _name)
        _present_as_sepp(_value)
        globals()[_name] = _value
del _name, _module, _eager


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt sepp.X is still an error

    def __getattr__(name: str) -> object:
        entry = _PUBLIC.get(name)
        if entry is None:
            raise AttributeError(f"module 'sepp' has no attribute {name!r}")
        value = getattr(import_module(f".{entry[0]}", __name__), name)
        _present_as_sepp(value)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_PUBLIC})
