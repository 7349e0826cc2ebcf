"""Limits on how many handlers run at once and how often they start, per key: `Limit` (the
value users give), the limiters a Worker admits each handler through (`gate`: in this process
(`local`), or across every process on the same server (`global_concurrency`, `global_rate`,
on the node rules of `permits`)), and `deferral`, which gives a job back for later without
costing it an attempt. Built on the client calls of `client_calls.LimitClient` and the
primitives of `_runtime.concurrency`; docs/limits.md is the design."""
