"""sepp-trio: a pure-Python, trio-native client for the sepp durable job queue."""

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
from ._rejections import CustomEntriesTooMany as CustomEntriesTooMany
from ._rejections import CustomKeyTooLong as CustomKeyTooLong
from ._rejections import CustomMapTooLarge as CustomMapTooLarge
from ._rejections import EncodingNotAllowed as EncodingNotAllowed
from ._rejections import IdempotencyKeyTooLong as IdempotencyKeyTooLong
from ._rejections import InvalidRequest as InvalidRequest
from ._rejections import JobRejection as JobRejection
from ._rejections import JobTypeNameTooLong as JobTypeNameTooLong
from ._rejections import JobTypeNotAllowed as JobTypeNotAllowed
from ._rejections import PayloadTooLarge as PayloadTooLarge
from ._rejections import QueueClosing as QueueClosing
from ._rejections import QueueFull as QueueFull
from ._rejections import QueueNameTooLong as QueueNameTooLong
from ._rejections import ScheduledTooFar as ScheduledTooFar
from ._rejections import UnknownQueue as UnknownQueue
from ._rejections import UnknownRejection as UnknownRejection
from ._rejections import describe_job_rejection as describe_job_rejection
from ._rejections import is_job_rejection as is_job_rejection
from ._retry import RetryPolicy as RetryPolicy
from ._router import DuplicateHandlerError as DuplicateHandlerError
from ._router import Handler as Handler
from ._router import Router as Router
from ._schedule import Schedule as Schedule
from ._scheduler import Scheduler as Scheduler
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
from ._worker import HandlerError as HandlerError
from ._worker import ShutdownHandle as ShutdownHandle
from ._worker import Worker as Worker
from .wire._status import StatusCode as StatusCode

__all__ = [
    "DEFAULT_MAX_RECEIVE_MESSAGE_BYTES",
    "AttemptMismatchError",
    "BatchRejection",
    "Batching",
    "BatchValidationError",
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
    "JobNotFoundError",
    "JobRejectedError",
    "JobRejection",
    "JobTypeNameTooLong",
    "JobTypeNotAllowed",
    "LeaseError",
    "MalformedResponseError",
    "MessageTooLargeError",
    "OverloadedError",
    "Payload",
    "PayloadTooLarge",
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
    "TraceContext",
    "TransportError",
    "UnauthenticatedError",
    "UnexpectedStatusError",
    "UnknownQueue",
    "UnknownQueuesError",
    "UnknownRejection",
    "ValidationError",
    "Worker",
    "__version__",
    "describe_job_rejection",
    "is_job_rejection",
    "open",
]
