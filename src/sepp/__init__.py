"""sepp-trio: a pure-Python, trio-native client for the sepp durable job queue."""

from typing import TYPE_CHECKING

from ._client.batching import Batching as Batching
from ._client.client import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES as DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
from ._client.client import Client as Client
from ._client.client import open as open
from ._client.retry import RetryPolicy as RetryPolicy
from ._model.errors import AttemptMismatchError as AttemptMismatchError
from ._model.errors import BatchValidationError as BatchValidationError
from ._model.errors import ClientError as ClientError
from ._model.errors import ConnectError as ConnectError
from ._model.errors import InvalidRequestError as InvalidRequestError
from ._model.errors import JobNotFoundError as JobNotFoundError
from ._model.errors import JobRejectedError as JobRejectedError
from ._model.errors import LeaseError as LeaseError
from ._model.errors import MalformedResponseError as MalformedResponseError
from ._model.errors import MessageTooLargeError as MessageTooLargeError
from ._model.errors import OverloadedError as OverloadedError
from ._model.errors import SeppError as SeppError
from ._model.errors import ServerInternalError as ServerInternalError
from ._model.errors import TransportError as TransportError
from ._model.errors import UnauthenticatedError as UnauthenticatedError
from ._model.errors import UnexpectedStatusError as UnexpectedStatusError
from ._model.errors import UnknownQueuesError as UnknownQueuesError
from ._model.errors import ValidationError as ValidationError
from ._model.rejections import JobRejection as JobRejection
from ._model.rejections import is_job_rejection as is_job_rejection
from ._model.types import BatchRejection as BatchRejection
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
from ._version import __version__ as __version__
from .wire._status import StatusCode as StatusCode

# Imported on first use, so that `import sepp` stays cheap for code that only enqueues: the
# Worker, Router and Scheduler machinery (and zoneinfo, which schedules need), and the
# rejection reasons (15 dataclasses, created when a rejection first appears), and the blocking
# client.
_LAZY = {
    "Backoff": "_worker.backoff",
    "CallNext": "_worker.middleware",
    "Middleware": "_worker.middleware",
    "DuplicateHandlerError": "_worker.router",
    "Handler": "_worker.router",
    "Router": "_worker.router",
    "Schedule": "_scheduling.schedule",
    "Scheduler": "_scheduling.scheduler",
    "SyncClient": "_client.sync",
    "connect": "_client.sync",
    "HandlerError": "_worker.worker",
    "ShutdownHandle": "_worker.shutdown",
    "Worker": "_worker.worker",
    "WorkerMonitor": "_worker.monitor",
    "CustomEntriesTooMany": "_model.rejection_reasons",
    "CustomKeyTooLong": "_model.rejection_reasons",
    "CustomMapTooLarge": "_model.rejection_reasons",
    "EncodingNotAllowed": "_model.rejection_reasons",
    "IdempotencyKeyTooLong": "_model.rejection_reasons",
    "InvalidRequest": "_model.rejection_reasons",
    "JobTypeNameTooLong": "_model.rejection_reasons",
    "JobTypeNotAllowed": "_model.rejection_reasons",
    "PayloadTooLarge": "_model.rejection_reasons",
    "QueueClosing": "_model.rejection_reasons",
    "QueueFull": "_model.rejection_reasons",
    "QueueNameTooLong": "_model.rejection_reasons",
    "ScheduledTooFar": "_model.rejection_reasons",
    "UnknownQueue": "_model.rejection_reasons",
    "UnknownRejection": "_model.rejection_reasons",
    "describe_job_rejection": "_model.rejection_reasons",
    "Task": "_payloads.task",
    "PayloadCodec": "_payloads.codecs",
    "PayloadDecodeError": "_payloads.codecs",
    "JsonCodec": "_payloads.codecs",
    "PydanticCodec": "_payloads.codecs",
    "MsgspecCodec": "_payloads.codecs",
}

if TYPE_CHECKING:
    from ._client.sync import SyncClient as SyncClient
    from ._client.sync import connect as connect
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
    from ._payloads.codecs import JsonCodec as JsonCodec
    from ._payloads.codecs import MsgspecCodec as MsgspecCodec
    from ._payloads.codecs import PayloadCodec as PayloadCodec
    from ._payloads.codecs import PayloadDecodeError as PayloadDecodeError
    from ._payloads.codecs import PydanticCodec as PydanticCodec
    from ._payloads.task import Task as Task
    from ._scheduling.schedule import Schedule as Schedule
    from ._scheduling.scheduler import Scheduler as Scheduler
    from ._worker.backoff import Backoff as Backoff
    from ._worker.middleware import CallNext as CallNext
    from ._worker.middleware import Middleware as Middleware
    from ._worker.monitor import WorkerMonitor as WorkerMonitor
    from ._worker.router import DuplicateHandlerError as DuplicateHandlerError
    from ._worker.router import Handler as Handler
    from ._worker.router import Router as Router
    from ._worker.shutdown import ShutdownHandle as ShutdownHandle
    from ._worker.worker import HandlerError as HandlerError
    from ._worker.worker import Worker as Worker

__all__ = [
    "DEFAULT_MAX_RECEIVE_MESSAGE_BYTES",
    "AttemptMismatchError",
    "Backoff",
    "BatchRejection",
    "Batching",
    "BatchValidationError",
    "CallNext",
    "Client",
    "ClientError",
    "ConnectError",
    "CustomEntriesTooMany",
    "CustomKeyTooLong",
    "CustomMapTooLarge",
    "DeadLetterCause",
    "DeadLetterRecord",
    "DuplicateHandlerError",
    "EncodingNotAllowed",
    "EnqueueAck",
    "EnqueueRequest",
    "Handler",
    "HandlerError",
    "IdempotencyKeyTooLong",
    "InvalidRequest",
    "InvalidRequestError",
    "Job",
    "JobContext",
    "JsonCodec",
    "JobNotFoundError",
    "JobRejectedError",
    "JobRejection",
    "JobTypeNameTooLong",
    "JobTypeNotAllowed",
    "LeaseError",
    "MalformedResponseError",
    "MessageTooLargeError",
    "MsgspecCodec",
    "Middleware",
    "OverloadedError",
    "Payload",
    "PayloadCodec",
    "PayloadDecodeError",
    "PayloadTooLarge",
    "PydanticCodec",
    "QueueClosing",
    "QueueFull",
    "QueueNameTooLong",
    "Retry",
    "RetryPolicy",
    "Router",
    "Schedule",
    "ScheduledTooFar",
    "Scheduler",
    "SeppError",
    "ServerInfo",
    "ServerInternalError",
    "ShutdownHandle",
    "StatusCode",
    "Task",
    "SyncClient",
    "TraceContext",
    "TransportError",
    "UnauthenticatedError",
    "UnexpectedStatusError",
    "UnknownQueue",
    "UnknownQueuesError",
    "UnknownRejection",
    "ValidationError",
    "Worker",
    "WorkerMonitor",
    "__version__",
    "connect",
    "describe_job_rejection",
    "is_job_rejection",
    "open",
]


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt sepp.X is still an error

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'sepp' has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})
