"""Which runtime the calling task runs on, picked once by the client (`sepp.open()`) and by
each service's `run()`: sniffio says which library runs it, and only then is that library's
runtime imported, so that `import sepp` loads neither (nor trio or asyncio)."""

from __future__ import annotations

import sniffio

from .protocol import Runtime, ServiceRuntime


def running_library() -> str | None:
    """ "trio", "asyncio", ...: what the calling task runs on (None: no async library)."""
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def runtime_of(library: str | None) -> Runtime | None:
    """The runtime for `library` (None: none for it)."""
    if library == "trio":
        from .trio_runtime import TRIO

        return TRIO
    if library == "asyncio":
        from .asyncio_runtime import ASYNCIO

        return ASYNCIO
    return None


def current_runtime(what: str) -> Runtime:
    """The client's runtime for the caller's library; RuntimeError outside trio or asyncio."""
    library = running_library()
    runtime = runtime_of(library)
    if runtime is None:
        raise RuntimeError(
            f"{what} must be called from trio (inside trio.run()) or asyncio (a running loop,"
            f" uvloop too){'' if library is None else f', not {library}'}"
        )
    return runtime


def service_runtime() -> ServiceRuntime:
    """A service's runtime for the caller's library (under asyncio with anyio's members,
    SeppError without anyio); RuntimeError outside any, SeppError on another."""
    library = running_library()
    if library is None:
        raise RuntimeError("a sepp Worker or Scheduler runs inside trio or asyncio")
    if library == "asyncio":
        from .asyncio_runtime import ASYNCIO

        return ASYNCIO.for_services()
    if library == "trio":
        from .trio_runtime import TRIO

        return TRIO
    from .._model.errors import SeppError

    raise SeppError(f"sepp's Worker and Scheduler run on trio or asyncio, not on {library}")
