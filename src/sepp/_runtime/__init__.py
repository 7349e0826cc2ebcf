"""The one concurrency seam of the package: what the client, the Worker and the Scheduler take
from the library they run on; nothing else of theirs imports it (trio, asyncio, anyio).
`protocol` says it once, in trio's vocabulary: the client's `Runtime` and the services'
`ServiceRuntime`. One runtime per library provides it, in a module of its own: `trio_runtime`,
`asyncio_runtime` (uvloop too; anyio for the services) and `blocking_runtime` (the client's
members only). `running` picks the caller's when a client is opened or a service run;
`concurrency` is what the services import; `shutdown_handle` stops a service from any thread.
Built on `wire` and `_model`."""
