"""The one concurrency seam of the package: what the client, the Worker and the Scheduler take
from the library they run on, and nothing else of theirs imports it (trio, asyncio, anyio).
`protocol` says what a runtime provides; `trio_runtime`, `asyncio_runtime` (uvloop too) and
`blocking_runtime` are the client's, `concurrency` (trio) and `anyio_concurrency` (asyncio) the
services'; `shutdown_handle` stops a service from any thread. Built on `wire` and `_model`."""
