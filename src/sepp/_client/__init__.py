"""The client: every operation written once (`operations`), the `Client` (trio, asyncio and
uvloop) and the blocking `SyncClient` that send them, auto-batching, local limit checks,
retries, connection options and OpenTelemetry glue. Built on `wire`, `_model` and the runtime
each front end runs its operations on (`_runtime`)."""
