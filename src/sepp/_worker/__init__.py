"""The Worker and what it runs: `Router` and handler registration (typed, thread and async
handlers, middleware), job slots, lease keeping, shutdown and the health/metrics monitor. The
Worker (`worker`) is put together from its settings, reserve loop, job processing, shutdown and
log lines, one module each; it uses only the client calls of `client_calls.WorkerClient`, tells
its monitor what happens through `events`, and takes the runtime of its library (trio, or
asyncio with anyio) only from `_runtime.concurrency`."""
