"""The Worker and what it runs: `Router` and handler registration (typed, thread and async
handlers, middleware), job slots, lease keeping, shutdown and the health/metrics monitor. The
Worker uses only the client calls of `client_calls.WorkerClient`."""
