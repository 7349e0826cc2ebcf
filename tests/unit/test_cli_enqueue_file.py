"""`enqueue-file`'s chunking: full EnqueueBatch chunks whatever each read returns (PyPy's
read1 returns at most 4 KiB), and a part-full chunk only before a read that would wait."""

from __future__ import annotations

import io
import json
import os
import queue
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import sepp
from sepp._cli import _enqueue_file as enqueue_file
from sepp._cli._enqueue_file import _load, _Loader


class SmallReads:
    """A source whose read1 returns at most `most` bytes, as PyPy's BufferedReader does."""

    def __init__(self, inner: Any, most: int) -> None:
        self.inner, self.most = inner, most
        self.reads = 0

    def read1(self, size: int) -> bytes:
        self.reads += 1
        return bytes(self.inner.read1(min(size, self.most)))

    def fileno(self) -> int:
        return int(self.inner.fileno())


class RecordingClient:
    """Acks every job and records each chunk's size."""

    def __init__(self) -> None:
        self.chunks: list[int] = []
        self.sent = trio.Event()

    async def enqueue_batch(self, requests: Sequence[sepp.EnqueueRequest]) -> list[Any]:
        self.chunks.append(len(requests))
        self.sent.set()
        return [sepp.EnqueueAck(job_id=f"j{i}", deduplicated=False) for i in range(len(requests))]


def pipe_reader(fd: int) -> io.BufferedReader:
    return open(fd, "rb")


def lines(count: int, start: int = 0) -> bytes:
    return b"".join(
        json.dumps({"queue": "q", "job_type": "t", "json": {"row": n}}).encode() + b"\n"
        for n in range(start, start + count)
    )


async def load(source: Any, max_batch: int = 256) -> tuple[RecordingClient, _Loader]:
    client = RecordingClient()
    loader = _Loader(client, max_batch)  # type: ignore[arg-type]
    await _load(loader, source)
    return client, loader


async def test_a_file_read_in_small_pieces_goes_out_in_full_chunks() -> None:
    source = SmallReads(io.BytesIO(lines(1000)), most=100)  # no descriptor: like a file
    client, loader = await load(source)
    assert source.reads > 300  # each read held a line or two
    assert client.chunks == [256, 256, 256, 232]
    assert loader.tally.enqueued == 1000


async def test_a_pipe_read_4_kib_at_a_time_goes_out_in_full_chunks() -> None:
    read_end, write_end = os.pipe()
    data = lines(300)
    assert len(data) < 64 * 1024  # the whole input fits in the pipe: written before the reads
    os.write(write_end, data)
    os.close(write_end)
    with pipe_reader(read_end) as pipe:
        source = SmallReads(pipe, most=4096)
        client, _ = await load(source)
    assert source.reads > 3
    assert client.chunks == [256, 44]


class Producer:
    """A source fed by the test: read1 waits for the next piece; b"" is the end."""

    def __init__(self) -> None:
        self.pieces: queue.Queue[bytes] = queue.Queue()

    def read1(self, size: int) -> bytes:
        return self.pieces.get(timeout=60)


async def test_lines_from_a_slow_producer_go_out_before_the_next_read_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Whether more input is ready is the producer's queue (the real check is tested below).
    monkeypatch.setattr(enqueue_file, "_more_input_ready", lambda s: not s.pieces.empty())
    producer, client = Producer(), RecordingClient()
    loader = _Loader(client, 256)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_load, loader, producer)
        producer.pieces.put(lines(10))
        with trio.fail_after(30):
            await client.sent.wait()  # sent while the producer has not sent more
        assert client.chunks == [10]
        for piece in (lines(3, start=10), lines(2, start=13), b""):  # all there before a read
            producer.pieces.put(piece)
    assert client.chunks == [10, 5]
    assert loader.tally.enqueued == 15


def test_input_is_ready_in_a_file_always_and_in_a_pipe_when_written(tmp_path: Path) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_bytes(b"")
    with open(path, "rb") as empty_file:
        assert enqueue_file._more_input_ready(empty_file)  # a read returns at once: b""
    assert enqueue_file._more_input_ready(io.BytesIO())  # type: ignore[arg-type]
    read_end, write_end = os.pipe()
    with open(read_end, "rb") as pipe:
        try:
            assert not enqueue_file._more_input_ready(pipe)
            os.write(write_end, b"x")
            assert enqueue_file._more_input_ready(pipe)
            assert pipe.read1(10) == b"x"
            assert not enqueue_file._more_input_ready(pipe)
        finally:
            os.close(write_end)
        assert enqueue_file._more_input_ready(pipe)  # the end: a read returns b"" at once
