"""The drivers that give an engine its socket: `_base` (the call loop every driver shares:
deadline, transparent retry), `_core` (the connection state they share: calls lost on death,
events, failed writes, GOAWAY hand-over, dialling and the connect-failure gate), `_trio` (trio
streams, for `sepp.Client`) and `_blocking` (plain sockets in the calling thread, for
`SyncClient`), each only its I/O and wake-ups; TLS over memory buffers for both (`_tls`). Only
`_trio` and its `_waiters` import trio."""
