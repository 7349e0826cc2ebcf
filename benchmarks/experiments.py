"""What-if patches, to size an optimisation before it is written properly in src/.

Applied only inside a sepp-trio benchmark driver process (``trio_driver.py --experiment
a,b``; the harness runs such a driver as an extra client with ``--variant a,b``), never by the
library or the tests. Each patch is a quick, possibly unsafe approximation of a change: it
shows what the change would buy, not how to make it.

- ``h2``: run on the reference engine (``sepp.open(..., wire_engine="h2")``) instead of the
  default codec. The harness runs this variant by default, as the ``sepp-trio+h2`` column. The
  four patches below only matter on that engine.
- ``no_frame_repr``: h2 4.4 calls ``repr(frame)`` on every received frame for a trace log line
  that is never printed; make that repr free.
- ``quiet_hpack_log``: hpack calls its module logger's ``debug`` about 30 times per call even
  when it is disabled; swap in a logger whose ``debug`` does nothing.
- ``no_open_stream_scan``: h2's ``send_headers`` counts open streams by walking every stream
  (O(concurrency) per call) to enforce MAX_CONCURRENT_STREAMS, which our connection already
  enforces; count only every 128th call (the walk also prunes closed streams).
- ``hpack_cache``: cache each header field's encoded bytes while the HPACK dynamic table is
  unchanged, so the constant per-method headers cost a dict lookup each.
- ``no_timeout``: send no ``grpc-timeout`` (connect with ``rpc_timeout=None``): the cost of
  encoding a per-call literal header. Changes behaviour; measurement only.
- ``joined_requests``: join an EnqueueBatch request's parts into one ``bytes`` before the wire
  layer, as every request was before a big payload travelled as a part of its own: what not
  copying a big payload saves (``enqueue_64k``, ``enqueue_1m``).
- ``no_loop_watch``: Workers made without the loop watch (``loop_block_warning=None``), whose
  stamping of each handler step is on every job's path: what it costs (``drain_worker``).
- ``log_info``: logging configured as the command line's default does it for ``worker``
  (INFO, text format, the command's filter), to /dev/null: what the per-job line costs when it
  is written (``python -m benchmarks.hot_path``; the library alone logs nothing at INFO).
- ``w_no_log``, ``w_no_otel``, ``w_no_lease_watch``: the Worker without, in turn, its per-job
  log call, its OpenTelemetry guards (the process span and the metrics' ``enabled``), and the
  lease keeper's watch and release: ablations that size each part of its per-job work
  (``python -m benchmarks.hot_path --cases worker worker+w_no_log ...``); unsafe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

PATCHES: dict[str, Callable[[], None]] = {}
_H2_PATCHES = ("h2", "no_frame_repr", "quiet_hpack_log", "no_open_stream_scan", "hpack_cache")
# Options for sepp.open() that an experiment needs (read by the driver's connect op).
OPEN_OPTIONS: dict[str, Any] = {}


def _patch(fn: Callable[[], None]) -> Callable[[], None]:
    PATCHES[fn.__name__] = fn
    return fn


@_patch
def h2() -> None:
    OPEN_OPTIONS["wire_engine"] = "h2"


@_patch
def no_frame_repr() -> None:
    import hyperframe.frame

    hyperframe.frame.Frame.__repr__ = lambda self: "<frame>"  # type: ignore[method-assign]


@_patch
def quiet_hpack_log() -> None:
    import hpack.hpack

    class _Quiet:
        def debug(self, *args: object, **kwargs: object) -> None:
            pass

    hpack.hpack.log = _Quiet()  # type: ignore[assignment]


@_patch
def no_open_stream_scan() -> None:
    import h2.connection

    def open_outbound_streams(self: Any) -> int:
        n = self.__dict__.get("_sepp_exp_calls", 0) + 1
        self.__dict__["_sepp_exp_calls"] = n
        if n % 128 == 0:
            return int(self._open_streams(self.highest_outbound_stream_id % 2))
        return 0

    h2.connection.H2Connection.open_outbound_streams = property(  # type: ignore[assignment]
        open_outbound_streams
    )


@_patch
def hpack_cache() -> None:
    import hpack
    import hpack.hpack
    import hpack.table

    base_add = hpack.hpack.Encoder.add
    table_add = hpack.table.HeaderTable.add

    def counting_add(self: Any, name: bytes, value: bytes) -> Any:
        self.__dict__["_sepp_exp_adds"] = self.__dict__.get("_sepp_exp_adds", 0) + 1
        return table_add(self, name, value)

    hpack.table.HeaderTable.add = counting_add  # type: ignore[method-assign]

    class CachingEncoder(hpack.hpack.Encoder):
        def __init__(self) -> None:
            super().__init__()
            self._cache: dict[tuple[bool, bytes, bytes], bytes] = {}
            self._entries = -1

        def encode(self, headers: Iterable[Any], huffman: bool = True) -> bytes:
            table = self.header_table
            adds = table.__dict__.get("_sepp_exp_adds", 0)
            if table.resized or adds != self._entries:
                self._cache.clear()
            parts = []
            if table.resized:
                parts.append(self._encode_table_size_change())
                table.resized = False
            cache = self._cache
            for header in headers:
                sensitive = isinstance(header, hpack.HeaderTuple) and not header.indexable
                key = (sensitive, header[0], header[1])
                hit = cache.get(key)
                if hit is None:
                    before = table.__dict__.get("_sepp_exp_adds", 0)
                    hit = base_add(self, (header[0], header[1]), sensitive, huffman)
                    if table.__dict__.get("_sepp_exp_adds", 0) != before:
                        cache.clear()
                    elif not sensitive:  # per-call values would only grow the cache
                        cache[key] = hit
                parts.append(hit)
            self._entries = table.__dict__.get("_sepp_exp_adds", 0)
            return b"".join(parts)

    import h2.connection

    orig_init = h2.connection.H2Connection.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        self.encoder = CachingEncoder()

    h2.connection.H2Connection.__init__ = init  # type: ignore[method-assign]


@_patch
def no_timeout() -> None:
    OPEN_OPTIONS["rpc_timeout"] = None


@_patch
def joined_requests() -> None:
    from sepp._model import wire_requests

    in_parts = wire_requests.enqueue_batch

    def joined(*args: Any, **kwargs: Any) -> bytes:
        request = in_parts(*args, **kwargs)
        return request if isinstance(request, bytes) else b"".join(request)

    wire_requests.enqueue_batch = joined  # type: ignore[assignment]


@_patch
def no_loop_watch() -> None:
    import functools

    import sepp

    init = sepp.Worker.__init__

    @functools.wraps(init)
    def without_watch(self: sepp.Worker, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("loop_block_warning", None)
        init(self, *args, **kwargs)

    sepp.Worker.__init__ = without_watch  # type: ignore[method-assign]


@_patch
def log_info() -> None:
    import logging
    import os

    from sepp._cli._logging import TEXT_FORMAT, NotHandledOnTheWay

    handler = logging.StreamHandler(open(os.devnull, "w"))
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    handler.addFilter(NotHandledOnTheWay())
    logging.basicConfig(level=logging.INFO, handlers=[handler])


@_patch
def w_no_log() -> None:
    from sepp._worker import reporting

    reporting.WorkerReport.finished = lambda self, *args: None  # type: ignore[method-assign]


@_patch
def w_no_otel() -> None:
    from sepp._client import otel
    from sepp._worker import processing

    processing._otel.process_span = lambda job, worker_id: otel.NOOP_SPAN  # type: ignore[assignment]
    otel.WorkerMetrics.enabled = False  # type: ignore[assignment,misc]


@_patch
def w_no_lease_watch() -> None:
    from sepp._worker import lease_keeper

    lease_keeper.LeaseKeeper.watch = lambda self, *args: None  # type: ignore[method-assign]
    lease_keeper.LeaseKeeper.release = lambda self, *args: None  # type: ignore[method-assign]


def apply(names: str) -> list[str]:
    """Apply the comma-separated patches (``all``: the h2 engine's)."""
    chosen = [n for n in names.split(",") if n]
    if chosen == ["all"]:
        chosen = [n for n in PATCHES if n in _H2_PATCHES]
    for name in chosen:
        if name not in PATCHES:
            raise SystemExit(f"unknown experiment {name!r}; choose from {sorted(PATCHES)}")
        PATCHES[name]()
    return chosen
