"""The drivers that give an engine its socket: `_base` (the call loop every driver shares:
deadline, transparent retry, GOAWAY verdicts), `_trio` (trio streams, for `sepp.Client`) and
`_blocking` (plain sockets in the calling thread, for `SyncClient`); TLS over memory buffers
for both (`_tls`)."""
