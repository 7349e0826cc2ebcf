"""The drivers that give an engine its socket: `_base` (the call loop every driver shares:
deadline, transparent retry), `_core` (the connection state they share: calls lost on death,
events, failed writes, GOAWAY hand-over, connecting (TCP, TLS handshake, SETTINGS, and what a
failure is called), dialling again and the connect-failure gate), and one driver per front
end, each only its I/O and wake-ups: `_trio` (trio streams, for `sepp.Client` under trio),
`_asyncio` (a non-blocking socket on the loop's readers and timers, for `sepp.Client` under
asyncio and uvloop; trio's cancel scopes for it in `_asyncio_scopes`) and `_blocking` (plain
sockets in the calling thread, for `SyncClient`); TLS over memory buffers for all three
(`_tls`). Only `_trio` and its `_waiters` import trio, only `_asyncio` and `_asyncio_scopes`
asyncio."""
