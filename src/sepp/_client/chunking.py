"""How big an enqueue is on the wire, and splitting a best-effort batch into calls the server
accepts: at most `max_enqueue_batch` jobs and well under its message-size cap each."""

from __future__ import annotations

from collections.abc import Sequence

from .._model.types import EnqueueRequest

# The server's defaults: max_enqueue_batch is advertised (GetServerInfo), max_message_bytes
# (16 MiB, restart-only) is not. A chunk's estimate stays under half the latter.
DEFAULT_MAX_ENQUEUE_BATCH = 256
# sepp 0.1.1's max_message_bytes: the largest request it decodes. Not advertised, so a request
# we could only know to fail (an atomic batch, an auto-batch) is refused or capped by it here.
SERVER_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_CHUNK_BYTES = SERVER_MAX_MESSAGE_BYTES // 2
# Chunks of one enqueue_batch in flight at once.
MAX_CONCURRENT_CHUNKS = 4
_ENVELOPE_BYTES = 64  # per-job protobuf overhead beyond the variable fields, generously


def estimated_bytes(request: EnqueueRequest) -> int:
    """An upper bound of the job's encoded size (strings at 4 bytes a character)."""
    size = _ENVELOPE_BYTES + (len(request.queue) + len(request.job_type)) * 4
    payload = request.payload
    if payload is not None:
        size += len(payload.data) + len(payload.encoding) * 4
    if request.idempotency_key is not None:
        size += len(request.idempotency_key) * 4
    if request.custom:
        for key, value in request.custom.items():
            size += 16 + len(key) * 4 + (len(value) * 4 if isinstance(value, str) else 8)
    if request.trace_context is not None:
        size += 80 + len(request.trace_context.tracestate or "") * 4
    return size


def _total_bytes(requests: Sequence[EnqueueRequest]) -> int:
    """The sum of estimated_bytes, a plain job's (a payload, no key, map or trace) inline."""
    total = 0
    for request in requests:
        payload = request.payload
        if (
            payload is None
            or request.idempotency_key is not None
            or request.custom
            or request.trace_context is not None
        ):
            total += estimated_bytes(request)
        else:
            names = len(request.queue) + len(request.job_type) + len(payload.encoding)
            total += _ENVELOPE_BYTES + names * 4 + len(payload.data)
    return total


def split_batch(
    requests: Sequence[EnqueueRequest], *, max_jobs: int, max_bytes: int = MAX_CHUNK_BYTES
) -> list[list[EnqueueRequest]]:
    """Consecutive chunks, in order, of at most `max_jobs` jobs and (unless one job alone is
    bigger) `max_bytes` estimated bytes."""
    if len(requests) <= max_jobs and _total_bytes(requests) <= max_bytes:
        return [list(requests)]  # the common batch: one call
    chunks: list[list[EnqueueRequest]] = []
    chunk: list[EnqueueRequest] = []
    chunk_bytes = 0
    for request in requests:
        size = estimated_bytes(request)
        if chunk and (len(chunk) >= max_jobs or chunk_bytes + size > max_bytes):
            chunks.append(chunk)
            chunk, chunk_bytes = [], 0
        chunk.append(request)
        chunk_bytes += size
    if chunk:
        chunks.append(chunk)
    return chunks
