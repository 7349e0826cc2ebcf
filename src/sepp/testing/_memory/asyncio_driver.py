"""The memory server on asyncio (uvloop too): the trio driver's shape on asyncio's streams —
a task per connection that reads, a writer beside it, and a timer task."""

from __future__ import annotations

import asyncio
import contextlib
import math

from .core import ServerCore

STOP_GRACE_S = 5.0
_READ_BYTES = 65536


class AsyncioDriver:
    def __init__(self, core: ServerCore) -> None:
        self.core = core
        self._loop = asyncio.get_running_loop()
        self._wake_timer = asyncio.Event()
        self._timer_at = math.inf
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer_task: asyncio.Task[None] | None = None
        self._unwatch = core.clock.watch(self.poke_threadsafe)

    def poke(self) -> None:
        if self.core.next_wakeup() < self._timer_at:
            self._wake_timer.set()

    def poke_threadsafe(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed
            self._loop.call_soon_threadsafe(self._wake_timer.set)

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, host, port)
        sockname = self._server.sockets[0].getsockname()
        self._timer_task = asyncio.create_task(self._timer())
        return str(sockname[0]), int(sockname[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        pending = asyncio.Event()
        connection = self.core.connection(pending.set)

        async def write() -> None:
            while True:
                data = connection.data_to_send()
                if data:
                    writer.write(data)
                    await writer.drain()
                elif connection.closed:
                    return
                else:
                    await pending.wait()
                    pending.clear()

        writing = asyncio.create_task(write())
        try:
            while not connection.closed:
                reading = asyncio.ensure_future(reader.read(_READ_BYTES))
                done, _ = await asyncio.wait(
                    {reading, writing}, return_when=asyncio.FIRST_COMPLETED
                )
                if reading not in done:
                    reading.cancel()
                    break  # the writer ended: the connection is done
                connection.receive(reading.result())
                self.poke()
            pending.set()
            await writing
        except (ConnectionError, OSError):
            pass
        finally:
            writing.cancel()
            self.core.closed(connection)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)
            self._tasks.discard(task)

    async def _timer(self) -> None:
        core = self.core
        while True:
            at = self._timer_at = core.next_wakeup()
            delay = at - self._loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wake_timer.wait(), None if math.isinf(delay) else delay
                    )
            self._timer_at = -math.inf
            self._wake_timer.clear()
            core.on_time()

    async def stop(self) -> None:
        self.core.stop()
        self._unwatch()
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        if tasks:
            _, still = await asyncio.wait(tasks, timeout=STOP_GRACE_S)
            for task in still:
                task.cancel()
        if self._timer_task is not None:
            self._timer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer_task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
