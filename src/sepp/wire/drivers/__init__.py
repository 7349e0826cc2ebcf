"""The drivers that give an engine its socket: `_base` (the call loop every driver shares:
deadline, transparent retry), `_core` (the connection state they share: calls lost on death,
events, failed writes, GOAWAY hand-over, connecting (TCP, TLS handshake, SETTINGS, and what a
failure is called), dialling again and the connect-failure gate), and one driver per front
end, each only its I/O and wake-ups: `_trio` (trio streams, for `sepp.Client` under trio),
`_asyncio` (a non-blocking socket on the loop's readers and timers, for `sepp.Client` under
asyncio and uvloop; trio's cancel scopes for it in `_asyncio_scopes`) and `_blocking` (plain
sockets in the calling thread, for `SyncClient`); TLS over memory buffers for all three
(`_tls`). Only `_trio` and its `_waiters` import trio, only `_asyncio` and `_asyncio_scopes`
asyncio. Other layers import what they use from here, never from those modules (the
module structure test holds it): `_base`'s names now, each driver's with its first use (so
`import sepp` under trio loads neither the asyncio nor the blocking driver)."""

from typing import TYPE_CHECKING

from ._base import ChannelBase as ChannelBase
from ._base import ChannelOptions as ChannelOptions
from ._base import Endpoint as Endpoint
from ._base import RpcError as RpcError

if TYPE_CHECKING:
    from ._asyncio import AsyncioChannel as AsyncioChannel
    from ._asyncio_scopes import MoveOnAt as MoveOnAt
    from ._asyncio_scopes import enclosing_deadline as enclosing_deadline
    from ._blocking import BlockingChannel as BlockingChannel
    from ._trio import Channel as Channel

__all__ = [
    "AsyncioChannel",
    "BlockingChannel",
    "Channel",
    "ChannelBase",
    "ChannelOptions",
    "Endpoint",
    "MoveOnAt",
    "RpcError",
    "enclosing_deadline",
]

# The drivers' own names, by the module each loads from on first use.
_LAZY = {
    "AsyncioChannel": "_asyncio",
    "BlockingChannel": "_blocking",
    "Channel": "_trio",
    "MoveOnAt": "_asyncio_scopes",
    "enclosing_deadline": "_asyncio_scopes",
}

if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})
