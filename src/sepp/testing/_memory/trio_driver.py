"""The memory server on trio: a listener, a task per connection (it reads; a writer beside it
sends whenever its connection has bytes), and a timer task that sleeps until the core's next
due time, woken early when a call moves that time forward. Everything the core does happens
in the trio run's thread."""

from __future__ import annotations

import math

import trio

from .core import ServerCore

# How long a graceful stop waits for connections to answer their calls and close, on the
# run's clock.
STOP_GRACE_S = 5.0
_READ_BYTES = 65536


class TrioDriver:
    def __init__(self, core: ServerCore) -> None:
        self.core = core
        self._token = trio.lowlevel.current_trio_token()
        self._wake_timer = trio.Event()
        self._timer_at = math.inf  # what the timer sleeps until
        self._listeners: list[trio.SocketListener] = []
        self._nursery: trio.Nursery | None = None
        self._open_connections = 0
        self._no_connections = trio.Event()
        self._no_connections.set()

    def poke(self) -> None:
        """A call or the clock may have brought the core's next due time forward."""
        if self.core.next_wakeup() < self._timer_at:
            self._wake_timer.set()

    def poke_threadsafe(self) -> None:
        try:
            self._token.run_sync_soon(self._wake_timer.set)
        except trio.RunFinishedError:
            pass

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        self._listeners = await trio.open_tcp_listeners(port, host=host)
        sockname = self._listeners[0].socket.getsockname()
        return str(sockname[0]), int(sockname[1])

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        unwatch = self.core.clock.watch(self.poke_threadsafe)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._timer)
                for listener in self._listeners:
                    nursery.start_soon(self._accept, listener)
                task_status.started()
        finally:
            unwatch()

    async def _accept(self, listener: trio.SocketListener) -> None:
        assert self._nursery is not None
        while True:
            try:
                stream = await listener.accept()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            except OSError:  # the peer went away before it was accepted
                continue
            self._nursery.start_soon(self._serve, stream)

    async def _serve(self, stream: trio.SocketStream) -> None:
        if self._open_connections == 0:
            self._no_connections = trio.Event()
        self._open_connections += 1
        pending = [trio.Event()]

        def on_output() -> None:
            pending[0].set()

        connection = self.core.connection(on_output)
        try:
            async with trio.open_nursery() as nursery:

                async def write() -> None:
                    while True:
                        data = connection.data_to_send()
                        if data:
                            await stream.send_all(data)
                        elif connection.closed:
                            nursery.cancel_scope.cancel()
                            return
                        else:
                            await pending[0].wait()
                            pending[0] = trio.Event()

                nursery.start_soon(write)
                while not connection.closed:
                    connection.receive(await stream.receive_some(_READ_BYTES))
                    self.poke()
                on_output()  # let the writer flush what is left, then end
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self.core.closed(connection)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            self._open_connections -= 1
            if self._open_connections == 0:
                self._no_connections.set()

    async def _timer(self) -> None:
        core = self.core
        while True:
            at = self._timer_at = core.next_wakeup()
            if at > trio.current_time():
                with trio.move_on_at(at):
                    await self._wake_timer.wait()
            self._timer_at = -math.inf  # awake: no poke needed until it sleeps again
            self._wake_timer = trio.Event()
            core.on_time()

    async def stop(self) -> None:
        """GOAWAY, then wait (at most STOP_GRACE_S) for the connections to finish, then end."""
        self.core.stop()
        for listener in self._listeners:
            await listener.aclose()
        with trio.move_on_after(STOP_GRACE_S):
            await self._no_connections.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
