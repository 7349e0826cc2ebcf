"""Running the same calls against the real sepp server and the memory server, and what is
compared: each call's answer, as a plain value.

A call is sent raw (`Side.call`: the request message's bytes through the client's channel, so
that bad input the client would refuse locally reaches the server), and its answer is the
status code and message of a failure, or the response message as a dict, with what differs
by nature taken out:

- job ids become labels ("j0", "j1", ... in the order the enqueue answers first name them),
  so a dedup hit answers the label of the job it hit;
- times a server stamps (enqueued_at, failed_at, server_time) are dropped, and a lease's
  expiry becomes its length from the call's start (`Approx`: within `TOLERANCE_S`);
  timestamps a client sent and the server echoes (scheduled_at, ScheduledTooFar.actual) stay;
- jobs the real server orders by their random ids (equal priority and enqueue millisecond in
  one queue) are sorted by label within each such run, and so are dead letters of the same
  failure millisecond and queue.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import trio
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

import sepp
from sepp._pb import queue_pb2 as pb
from sepp.testing import memory_server, sepp_server
from sepp.wire.drivers._base import RpcError

TOLERANCE_S = 0.25
RESPONSES: dict[str, type[Message]] = {
    "EnqueueBatch": pb.EnqueueBatchResponse,
    "EnqueueAtomic": pb.EnqueueAtomicResponse,
    "Reserve": pb.ReserveResponse,
    "Ack": pb.AckResponse,
    "Nack": pb.NackResponse,
    "Extend": pb.ExtendResponse,
    "DrainDeadLetters": pb.DrainDeadLettersResponse,
    "GetServerInfo": pb.GetServerInfoResponse,
}


@dataclass(frozen=True)
class Approx:
    """A duration in seconds, equal to another within TOLERANCE_S."""

    seconds: float

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Approx) and abs(self.seconds - other.seconds) <= TOLERANCE_S

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"~{self.seconds:.2f}s"


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass
class Side:
    """One server (`name`: "real" or "memory") and a client of it."""

    name: str
    address: str
    client: sepp.Client
    labels: dict[str, str] = field(default_factory=dict)
    transcript: list[Any] = field(default_factory=list)
    _numbers: itertools.count[int] = field(default_factory=itertools.count)

    def label(self, job_id: str) -> str:
        if job_id not in self.labels:
            self.labels[job_id] = f"j{next(self._numbers)}"
        return self.labels[job_id]

    def job_id(self, label: str) -> str:
        """The id of the job labelled `label` here (for acks and nacks that name it)."""
        for job_id, known in self.labels.items():
            if known == label:
                return job_id
        return label  # not a label: sent as it is (an unknown or malformed id)

    async def call(self, method: str, request: Message, *, record: bool = True) -> Any:
        """Send `request` raw; returns (and records) the normalized answer."""
        started = datetime.now(timezone.utc)
        try:
            body = await self.client._channel.call(
                method, request.SerializeToString(), timeout=30.0
            )
        except RpcError as exc:
            answer: Any = ("error", int(exc.code), exc.details)
        else:
            message = RESPONSES[method].FromString(body)
            answer = (method, self._normalize(method, message, started))
        if record:
            self.transcript.append(answer)
        return answer

    def note(self, value: Any) -> None:
        """Put something this side observed into the transcript."""
        self.transcript.append(value)

    def _normalize(self, method: str, message: Message, started: datetime) -> Any:
        data = MessageToDict(message, preserving_proto_field_name=True)
        if method in ("EnqueueBatch", "EnqueueAtomic"):
            for result in data.get("results", []):
                if "success" in result:
                    result["success"]["job_id"] = self.label(result["success"]["job_id"])
            for response in data.get("success", {}).get("responses", []):
                response["job_id"] = self.label(response["job_id"])
        elif method == "Reserve":
            data["jobs"] = _sorted_ties(
                [self._job(job, started) for job in data.get("jobs", [])],
                ("queue", "priority", "enqueued_at"),
            )
            for job in data["jobs"]:
                job.pop("enqueued_at", None)
        elif method in ("Ack", "Nack"):
            data["job_id"] = self.label(data["job_id"])
        elif method == "Extend":
            data["job_id"] = self.label(data["job_id"])
            data["lease_expires_at"] = Approx(
                (_parse_time(data["lease_expires_at"]) - started).total_seconds()
            )
        elif method == "DrainDeadLetters":
            records = []
            for record in data.get("records", []):
                record["job"] = self._job(record["job"], started)
                record["job"].pop("enqueued_at", None)
                record["tie"] = (record.pop("failed_at", None), record["job"].get("queue"))
                records.append(record)
            data["records"] = _sorted_ties(records, ("tie",))
            for record in data["records"]:
                record.pop("tie")
        elif method == "GetServerInfo":
            server_time = _parse_time(data.pop("server_time"))
            data["server_time_near_ours"] = abs((server_time - started).total_seconds()) < 2
        return data

    def _job(self, job: dict[str, Any], started: datetime) -> dict[str, Any]:
        job["id"] = self.label(job["id"])
        expires = job.get("lease_expires_at")
        if expires is not None and not expires.startswith("1970-01-01T00:00:00"):
            job["lease_expires_at"] = Approx((_parse_time(expires) - started).total_seconds())
        return job


def _sorted_ties(items: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """`items` with each run of equal `keys` sorted by label (the real server's tie-break is
    its random ids)."""
    out: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []

    def key_of(item: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(repr(item.get(k)) for k in keys)

    def flush() -> None:
        out.extend(sorted(run, key=lambda item: _label_order(item.get("id") or item["job"]["id"])))
        run.clear()

    for item in items:
        if run and key_of(run[-1]) != key_of(item):
            flush()
        run.append(item)
    flush()
    return out


def _label_order(label: str) -> tuple[int, str]:
    return (int(label[1:]), label) if label[1:].isdigit() else (1 << 30, label)


Scenario = Callable[[Side], Awaitable[None]]


@contextlib.asynccontextmanager
async def servers(
    config: dict[str, Any] | None = None, *, wire_engine: str = "codec"
) -> AsyncIterator[tuple[str, str]]:
    """A real server and a memory server with the same config: their addresses."""
    config = _as_the_binary(config)
    async with (
        servers_real_only(config) as real,
        memory_server(config, wire_engine=wire_engine) as memory,
    ):
        yield real, memory.address


async def run_on_both(
    scenario: Scenario, config: dict[str, Any] | None = None, *, api_key: str | None = None
) -> tuple[Side, Side]:
    """Run `scenario` against both servers at once (each on its own client); returns the
    sides, whose transcripts the caller compares."""
    async with servers(config) as (real_address, memory_address):
        return await run_on_addresses(scenario, real_address, memory_address, api_key=api_key)


async def run_on_addresses(
    scenario: Scenario, real_address: str, memory_address: str, *, api_key: str | None = None
) -> tuple[Side, Side]:
    sides: list[Side] = []
    async with (
        sepp.open(real_address, api_key=api_key, keepalive_interval=None) as real_client,
        sepp.open(memory_address, api_key=api_key, keepalive_interval=None) as memory_client,
    ):
        real = Side("real", real_address, real_client)
        memory = Side("memory", memory_address, memory_client)
        sides = [real, memory]
        async with trio.open_nursery() as nursery:
            for side in sides:
                nursery.start_soon(scenario, side)
    return sides[0], sides[1]


def assert_same(real: Side, memory: Side) -> None:
    """The two transcripts, answer by answer: the first difference fails with both."""
    for index, (a, b) in enumerate(zip(real.transcript, memory.transcript, strict=False)):
        assert a == b, f"answer #{index} differs:\n real:   {a!r}\n memory: {b!r}"
    assert len(real.transcript) == len(memory.transcript), (
        f"{len(real.transcript)} answers from the real server, {len(memory.transcript)} from"
        " the memory server"
    )


# -- requests, briefly ------------------------------------------------------------------


def job(queue: str, job_type: str = "t", **fields: Any) -> pb.EnqueueRequest:
    """An EnqueueRequest; `payload=b"..."` (encoding application/octet-stream) or
    `payload=(data, encoding)`; `custom={k: value}` with str, int, float or bool values (None:
    a value left unset); `scheduled_at=datetime`."""
    request = pb.EnqueueRequest(queue=queue, job_type=job_type)
    payload = fields.pop("payload", None)
    if payload is not None:
        data, encoding = (
            payload if isinstance(payload, tuple) else (payload, "application/octet-stream")
        )
        request.payload.data = data
        request.payload.encoding = encoding
    for name, value in fields.pop("custom", {}).items():
        set_custom(request, name, value)
    scheduled_at = fields.pop("scheduled_at", None)
    if scheduled_at is not None:
        request.scheduled_at.FromDatetime(scheduled_at)
    traceparent = fields.pop("traceparent", None)
    if traceparent is not None:
        request.trace_context.traceparent = traceparent
    for name, value in fields.items():
        setattr(request, name, value)
    return request


def set_custom(request: pb.EnqueueRequest, key: str, value: Any) -> None:
    """`request.custom[key]` set to a str, int, float or bool; None: an entry with no value."""
    entry = request.custom[key]
    entry.Clear()
    if isinstance(value, bool):
        entry.bool_value = value
    elif isinstance(value, int):
        entry.int_value = value
    elif isinstance(value, float):
        entry.double_value = value
    elif isinstance(value, str):
        entry.string_value = value


def batch(*jobs: pb.EnqueueRequest) -> pb.EnqueueBatchRequest:
    return pb.EnqueueBatchRequest(jobs=list(jobs))


def reserve(
    *queues: str, lease_s: float | None = 30.0, wait_s: float | None = None, **fields: Any
) -> pb.ReserveRequest:
    request = pb.ReserveRequest(queues=list(queues), **fields)
    if lease_s is not None:
        request.lease_duration.FromMilliseconds(round(lease_s * 1000))
    if wait_s is not None:
        request.wait_timeout.FromMilliseconds(round(wait_s * 1000))
    return request


async def settle(side: Side) -> None:
    """Let a millisecond pass: jobs enqueued by later calls are not the real server's ties."""
    await trio.sleep(0.003)


@contextlib.contextmanager
def servers_in_threads(config: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """A real server and a memory server with the same config, each run from a thread of its
    own (so that many trio runs, one per hypothesis example, can use them): their
    addresses."""
    import threading

    from sepp.testing import MemoryServer

    config = _as_the_binary(config)

    started = threading.Event()
    box: dict[str, Any] = {}

    async def run_real() -> None:
        stop = trio.Event()
        box["stop"] = stop
        box["token"] = trio.lowlevel.current_trio_token()
        try:
            async with servers_real_only(config) as address:
                box["address"] = address
                started.set()
                await stop.wait()
        finally:
            started.set()

    def thread_main() -> None:
        try:
            trio.run(run_real)
        except BaseException as exc:
            box["failure"] = exc

    thread = threading.Thread(target=thread_main, name="real sepp server", daemon=True)
    thread.start()
    started.wait()
    if "failure" in box:
        thread.join()
        raise box["failure"]
    memory = MemoryServer(config).start()
    try:
        yield box["address"], memory.address
    finally:
        memory.stop()
        box["token"].run_sync_soon(box["stop"].set)
        thread.join()


def _as_the_binary(config: dict[str, Any] | None) -> dict[str, Any]:
    """`config` with the real server's own dead-letter default (none kept) unless it says,
    where sepp.testing's servers keep them 10 minutes."""
    config = dict(config or {})
    config["storage"] = {"dead_letter_retention_ms": 0, **config.get("storage", {})}
    return config


@contextlib.asynccontextmanager
async def servers_real_only(config: dict[str, Any]) -> AsyncIterator[str]:
    real_config = {"admin": {"enabled": False}, **config}
    real_config["storage"] = {"persist_mode": "buffer", **real_config.get("storage", {})}
    async with sepp_server(real_config) as real:
        yield real.address
