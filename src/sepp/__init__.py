"""sepp-trio: a pure-Python, trio-native client for the sepp durable job queue."""

from typing import TYPE_CHECKING

from ._batching import Batching as Batching
from ._client import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES as DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
from ._client import Client as Client
from ._client import open as open
from ._errors import AttemptMismatchError as AttemptMismatchError
from ._errors import BatchValidationError as BatchValidationError
from ._errors import ClientError as ClientError
from ._errors import ConnectError as ConnectError
from ._errors import InvalidRequestError as InvalidRequestError
from ._errors import JobNotFoundError as JobNotFoundError
from ._errors import JobRejectedError as JobRejectedError
from ._errors import LeaseError as LeaseError
from ._errors import MalformedResponseError as MalformedResponseError
from ._errors import MessageTooLargeError as MessageTooLargeError
from ._errors import OverloadedError as OverloadedError
from ._errors import SeppError as SeppError
from ._errors import ServerInternalError as ServerInternalError
from ._errors import TransportError as TransportError
from ._errors import UnauthenticatedError as UnauthenticatedError
from ._errors import UnexpectedStatusError as UnexpectedStatusError
from ._errors import UnknownQueuesError as UnknownQueuesError
from ._errors import ValidationError as ValidationError
from ._rejections import JobRejection as JobRejection
from ._rejections import is_job_rejection as is_job_rejection
from ._retry import RetryPolicy as RetryPolicy
from ._types import BatchRejection as BatchRejection
from ._types import DeadLetterCause as DeadLetterCause
from ._types import DeadLetterRecord as DeadLetterRecord
from ._types import EnqueueAck as EnqueueAck
from ._types import EnqueueRequest as EnqueueRequest
from ._types import Job as Job
from ._types import JobContext as JobContext
from ._types import Payload as Payload
from ._types import Retry as Retry
from ._types import ServerInfo as ServerInfo
from ._types import TraceContext as TraceContext
from ._version import __version__ as __version__
from .wire._status import StatusCode as StatusCode

# Imported on first use, so that `import sepp` stays cheap for code that only enqueues: the
# Worker, Router and Scheduler machinery (and zoneinfo, which schedules need), and the
# rejection reasons (15 dataclasses, created when a rejection first appears), and the blocking
# client.
_LAZY = {
    "Backoff": "_backoff",
    "CallNext": "_middleware",
    "Middleware": "_middleware",
    "DuplicateHandlerError": "_router",
    "Handler": "_router",
    "Router": "_router",
    "Schedule": "_schedule",
    "Scheduler": "_scheduler",
    "SyncClient": "_sync",
    "connect": "_sync",
    "HandlerError": "_worker",
    "ShutdownHandle": "_shutdown",
    "Worker": "_worker",
    "WorkerMonitor": "_monitor",
    "CustomEntriesTooMany": "_rejection_reasons",
    "CustomKeyTooLong": "_rejection_reasons",
    "CustomMapTooLarge": "_rejection_reasons",
    "EncodingNotAllowed": "_rejection_reasons",
    "IdempotencyKeyTooLong": "_rejection_reasons",
    "InvalidRequest": "_rejection_reasons",
    "JobTypeNameTooLong": "_rejection_reasons",
    "JobTypeNotAllowed": "_rejection_reasons",
    "PayloadTooLarge": "_rejection_reasons",
    "QueueClosing": "_rejection_reasons",
    "QueueFull": "_rejection_reasons",
    "QueueNameTooLong": "_rejection_reasons",
    "ScheduledTooFar": "_rejection_reasons",
    "UnknownQueue": "_rejection_reasons",
    "UnknownRejection": "_rejection_reasons",
    "describe_job_rejection": "_rejection_reasons",
    "Task": "_task",
    "PayloadCodec": "_codecs",
    "PayloadDecodeError": "_codecs",
    "JsonCodec": "_codecs",
    "PydanticCodec": "_codecs",
    "MsgspecCodec": "_codecs",
}

if TYPE_CHECKING:
    from ._backoff import Backoff as Backoff
    from ._codecs import JsonCodec as JsonCodec
    from ._codecs import MsgspecCodec as MsgspecCodec
    from ._codecs import PayloadCodec as PayloadCodec
    from ._codecs import PayloadDecodeError as PayloadDecodeError
    from ._codecs import PydanticCodec as PydanticCodec
    from ._middleware import CallNext as CallNext
    from ._middleware import Middleware as Middleware
    from ._monitor import WorkerMonitor as WorkerMonitor
    from ._rejection_reasons import CustomEntriesTooMany as CustomEntriesTooMany
    from ._rejection_reasons import CustomKeyTooLong as CustomKeyTooLong
    from ._rejection_reasons import CustomMapTooLarge as CustomMapTooLarge
    from ._rejection_reasons import EncodingNotAllowed as EncodingNotAllowed
    from ._rejection_reasons import IdempotencyKeyTooLong as IdempotencyKeyTooLong
    from ._rejection_reasons import InvalidRequest as InvalidRequest
    from ._rejection_reasons import JobTypeNameTooLong as JobTypeNameTooLong
    from ._rejection_reasons import JobTypeNotAllowed as JobTypeNotAllowed
    from ._rejection_reasons import PayloadTooLarge as PayloadTooLarge
    from ._rejection_reasons import QueueClosing as QueueClosing
    from ._rejection_reasons import QueueFull as QueueFull
    from ._rejection_reasons import QueueNameTooLong as QueueNameTooLong
    from ._rejection_reasons import ScheduledTooFar as ScheduledTooFar
    from ._rejection_reasons import UnknownQueue as UnknownQueue
    from ._rejection_reasons import UnknownRejection as UnknownRejection
    from ._rejection_reasons import describe_job_rejection as describe_job_rejection
    from ._router import DuplicateHandlerError as DuplicateHandlerError
    from ._router import Handler as Handler
    from ._router import Router as Router
    from ._schedule import Schedule as Schedule
    from ._scheduler import Scheduler as Scheduler
    from ._shutdown import ShutdownHandle as ShutdownHandle
    from ._sync import SyncClient as SyncClient
    from ._sync import connect as connect
    from ._task import Task as Task
    from ._worker import HandlerError as HandlerError
    from ._worker import Worker as Worker

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
