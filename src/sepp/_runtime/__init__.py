"""The one concurrency seam of the package: what the client, the Worker and the Scheduler take
from the library they run on; nothing else of theirs imports it (trio, asyncio, anyio).
`protocol` says what a runtime provides. The client's runtimes are `trio_runtime`,
`asyncio_runtime` (uvloop too) and `blocking_runtime`; the services' primitives are
`trio_concurrency` and `anyio_concurrency` (asyncio), picked by `concurrency`, which the
services import; `shutdown_handle` stops a service from any thread. Built on `wire` and
`_model`."""
