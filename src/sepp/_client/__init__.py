"""The client: every operation written once (`operations`), the trio `Client` and the blocking
`SyncClient` that send them, the runtimes those run on, auto-batching, local limit checks,
retries, connection options and OpenTelemetry glue. Built on `wire` and `_model`."""
