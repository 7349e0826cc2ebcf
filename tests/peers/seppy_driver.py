"""JSON-lines driver for the official peer client ``sepp-py`` 0.1.0.

Run it with the python of the sepp-py virtualenv (``scripts/ensure-seppy-venv.sh``
prints its path), never with this project's interpreter: sepp-py also imports as
``sepp``. Recommended invocation::

    $SEPPY_PY -I tests/peers/seppy_driver.py [--no-otel]

Protocol: one JSON object per line on stdin, one JSON object per line on
stdout. Every request has ``"op"`` and (optionally) ``"id"``; every response is
``{"id": <echoed>, "ok": true, "result": ...}`` or
``{"id": <echoed>, "ok": false, "error": {"type": <exception class name>,
"message": str(exc), ...extra fields}}``. Requests are handled one at a time,
in order, unless a request carries ``"concurrent": true``, in which case it runs
as a background task and its response is written when it finishes (match on
``id``). Nothing but protocol lines is ever written to stdout (fd 1 is
redirected to stderr at startup); logs go to stderr.

Modes:
  (default)        the JSON-lines server described above.
  --import-time    print the seconds taken by ``import sepp`` in this fresh
                   interpreter, then exit.
  --no-otel        make ``opentelemetry`` unimportable before importing sepp,
                   so sepp-py runs its no-OTel code paths (for benchmarks that
                   should not pay for the API's propagation/no-op spans). The
                   trace ops then fail with ``OtelUnavailable``.

See tests/peers/README.md for the op list and value encodings.
"""

from __future__ import annotations

import sys

# ---------------------------------------------------------------------------
# Bootstrap. Keep this block free of heavy imports: --import-time measures the
# cost of ``import sepp`` in a fresh interpreter.
# ---------------------------------------------------------------------------

_NO_OTEL = "--no-otel" in sys.argv[1:]


class _BlockOtel:
    """A meta-path finder that makes ``opentelemetry`` unimportable."""

    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by --no-otel)")
        return None


def _pin_sepp_py_on_path() -> None:
    """Make sure ``import sepp`` resolves to the installed sepp-py distribution,
    not to this repository's ``src/sepp`` (e.g. via PYTHONPATH)."""
    import importlib.metadata as md
    import os

    try:
        dist = md.distribution("sepp-py")
    except md.PackageNotFoundError:
        sys.stderr.write(
            "seppy_driver: the 'sepp-py' distribution is not installed in this interpreter "
            f"({sys.executable}); run it with the python printed by scripts/ensure-seppy-venv.sh\n"
        )
        raise SystemExit(3) from None
    site_dir = os.path.dirname(str(dist.locate_file("sepp/__init__.py")))
    site_dir = os.path.dirname(site_dir)
    if site_dir in sys.path:
        sys.path.remove(site_dir)
    sys.path.insert(0, site_dir)


if _NO_OTEL:
    sys.meta_path.insert(0, _BlockOtel())

if "--import-time" in sys.argv[1:]:
    import time as _time

    _pin_sepp_py_on_path()
    _t0 = _time.perf_counter()
    import sepp

    _dt = _time.perf_counter() - _t0
    sys.stdout.write(f"{_dt:.6f}\n")
    sys.stdout.flush()
    raise SystemExit(0)

_pin_sepp_py_on_path()

# ---------------------------------------------------------------------------
# Regular imports.
# ---------------------------------------------------------------------------

import asyncio  # noqa: E402
import base64  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import enum  # noqa: E402
import importlib.metadata as _md  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from datetime import datetime, timedelta, timezone  # noqa: E402
from typing import Any  # noqa: E402

import sepp  # noqa: E402
from sepp import (  # noqa: E402
    EnqueueRequest,
    HandlerError,
    Job,
    JobCtx,
    Payload,
    ReserveOptions,
    RetryDirective,
    RetryPolicy,
    SeppClient,
    TraceContext,
    Worker,
)
from sepp import _otel as sepp_otel  # noqa: E402
from sepp import errors as sepp_errors  # noqa: E402

SEPP_PY_VERSION = _md.version("sepp-py")
_EXPECTED_SEPP_PY = "0.1.0"


class DriverError(Exception):
    """A problem with the request itself (bad arguments, unknown job id...)."""


class UnknownOp(DriverError):
    pass


class OtelUnavailable(DriverError):
    pass


class NotConnected(DriverError):
    pass


# ---------------------------------------------------------------------------
# Value encodings.
# ---------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.b64decode(s.encode("ascii"), validate=True)


def _iso(dt: datetime | None) -> str | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.isoformat()


_FRACTION_RE = re.compile(r"(\.\d{6})\d+")


def _parse_iso(s: str) -> datetime:
    """Parse an RFC 3339 / ISO 8601 instant (``Z`` or an offset; digits past
    microseconds are truncated; a naive value is taken as UTC)."""
    if not isinstance(s, str):
        raise DriverError(f"expected an ISO 8601 string, got {type(s).__name__}")
    t = s.strip()
    if t.endswith(("Z", "z")):
        t = t[:-1] + "+00:00"
    t = _FRACTION_RE.sub(r"\1", t)
    try:
        dt = datetime.fromisoformat(t)
    except ValueError as exc:
        raise DriverError(f"invalid ISO 8601 instant {s!r}: {exc}") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt


def _encode_float(v: float) -> float | str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def encode_custom(custom: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for k, v in custom.items():
        if isinstance(v, bool):
            out[k] = {"t": "b", "v": v}
        elif isinstance(v, int):
            out[k] = {"t": "i", "v": str(v)}
        elif isinstance(v, float):
            out[k] = {"t": "d", "v": _encode_float(v)}
        elif isinstance(v, str):
            out[k] = {"t": "s", "v": v}
        else:  # pragma: no cover - sepp-py only yields the four primitives
            raise DriverError(f"custom[{k!r}] has unexpected type {type(v).__name__}")
    return out


def decode_custom(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise DriverError("custom must be a JSON object of {key: {t, v}}")
    out: dict[str, Any] = {}
    for k, tv in obj.items():
        if not isinstance(tv, dict) or "t" not in tv or "v" not in tv:
            raise DriverError(f"custom[{k!r}] must be {{'t': 's'|'i'|'d'|'b', 'v': ...}}")
        t, v = tv["t"], tv["v"]
        if t == "s":
            if not isinstance(v, str):
                raise DriverError(f"custom[{k!r}]: 's' value must be a string")
            out[k] = v
        elif t == "i":
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                raise DriverError(f"custom[{k!r}]: 'i' value must be a decimal string")
            try:
                out[k] = int(v)
            except ValueError as exc:
                raise DriverError(f"custom[{k!r}]: bad int {v!r}") from exc
        elif t == "d":
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise DriverError(f"custom[{k!r}]: 'd' value must be a number")
            out[k] = float(v)
        elif t == "b":
            if not isinstance(v, bool):
                raise DriverError(f"custom[{k!r}]: 'b' value must be true/false")
            out[k] = v
        else:
            raise DriverError(f"custom[{k!r}]: unknown type tag {t!r}")
    return out


def encode_trace_context(tc: TraceContext | None) -> dict[str, Any] | None:
    if tc is None:
        return None
    return {"traceparent": tc.traceparent, "tracestate": tc.tracestate}


def decode_enqueue_request(spec: dict[str, Any]) -> EnqueueRequest:
    if not isinstance(spec, dict):
        raise DriverError("a job spec must be a JSON object")
    payload = None
    if spec.get("payload_b64") is not None:
        payload = Payload(_unb64(spec["payload_b64"]), spec.get("encoding") or "")
    tc = None
    if spec.get("trace_context") is not None:
        t = spec["trace_context"]
        tc = TraceContext(t["traceparent"], t.get("tracestate"))
    scheduled_at = None
    if spec.get("scheduled_at") is not None:
        scheduled_at = _parse_iso(spec["scheduled_at"])
    return EnqueueRequest(
        queue=spec["queue"],
        job_type=spec["job_type"],
        payload=payload,
        idempotency_key=spec.get("idempotency_key"),
        priority=spec.get("priority"),
        max_attempts=spec.get("max_attempts"),
        custom=decode_custom(spec.get("custom")),
        trace_context=tc,
        scheduled_at=scheduled_at,
    )


def encode_ack(ack: Any) -> dict[str, Any]:
    return {"job_id": ack.job_id, "deduplicated": ack.deduplicated}


def to_jsonable(v: Any) -> Any:
    """Generic conversion for dataclass values (rejections, server info)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return _encode_float(v)
    if isinstance(v, datetime):
        return _iso(v)
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, bytes):
        return _b64(v)
    if isinstance(v, (list, tuple)):
        return [to_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): to_jsonable(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v):
        return {f.name: to_jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    return repr(v)


def encode_rejection(rej: sepp_errors.JobRejection) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(rej).__name__, "message": rej.message}
    if dataclasses.is_dataclass(rej):
        for f in dataclasses.fields(rej):
            out[f.name] = to_jsonable(getattr(rej, f.name))
    return out


def encode_job(job: Job) -> dict[str, Any]:
    ctx: JobCtx = job.ctx
    return {
        "id": ctx.id,
        "queue": ctx.queue,
        "job_type": ctx.job_type,
        "payload_b64": _b64(job.payload.data) if job.payload is not None else None,
        "encoding": job.payload.encoding if job.payload is not None else None,
        "priority": ctx.priority.value,
        "attempt": ctx.attempt,
        "max_attempts": ctx.max_attempts,
        "custom": encode_custom(ctx.custom),
        "enqueued_at": _iso(ctx.enqueued_at),
        "scheduled_at": _iso(ctx.scheduled_at),
        "lease_expires_at": _iso(ctx.lease_expires_at),
        "trace_context": encode_trace_context(ctx.trace_context),
    }


def encode_dead_letter(r: Any) -> dict[str, Any]:
    return {
        "queue": r.queue,
        "job_id": r.job_id,
        "job_type": r.job_type,
        "payload_b64": _b64(r.payload.data) if r.payload is not None else None,
        "encoding": r.payload.encoding if r.payload is not None else None,
        "priority": r.priority.value,
        "max_attempts": r.max_attempts,
        "custom": encode_custom(r.custom),
        "trace_context": encode_trace_context(r.trace_context),
        "enqueued_at": _iso(r.enqueued_at),
        "scheduled_at": _iso(r.scheduled_at),
        "cause": r.cause.value,
        "failed_at": _iso(r.failed_at),
        "final_attempt": r.final_attempt,
        "last_reason": r.last_reason,
    }


def encode_error(exc: BaseException) -> dict[str, Any]:
    err: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    mro = [c.__name__ for c in type(exc).__mro__]
    err["mro"] = mro[: mro.index("BaseException")] if "BaseException" in mro else mro
    if isinstance(exc, sepp_errors.JobRejectedError):
        err["rejection"] = encode_rejection(exc.rejection)
    elif isinstance(exc, sepp_errors.BatchValidationError):
        err["errors"] = [
            {"index": e.index, "rejection": encode_rejection(e.rejection)} for e in exc.errors
        ]
    elif isinstance(exc, sepp_errors.ConnectError):
        err["addr"], err["reason"] = exc.addr, exc.reason
    elif isinstance(exc, sepp_errors.UnexpectedStatusError):
        err["code"], err["status_message"] = exc.code.name, exc.status_message
    elif isinstance(exc, sepp_errors.BatchResultCountMismatchError):
        err["expected"], err["got"] = exc.expected, exc.got
    if not isinstance(exc, (sepp_errors.SeppError, DriverError)):
        err["traceback"] = "".join(traceback.format_exception(exc))[-4000:]
    return err


def decode_retry(spec: Any) -> RetryDirective:
    if spec is None or spec == "default":
        return RetryDirective.DEFAULT
    if spec == "dead_letter":
        return RetryDirective.DEAD_LETTER
    if isinstance(spec, dict) and "after_s" in spec:
        return RetryDirective.after(timedelta(seconds=float(spec["after_s"])))
    raise DriverError(f"bad retry directive {spec!r}: use 'default', 'dead_letter' or {{after_s}}")


def _secs(v: Any, name: str) -> timedelta:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DriverError(f"{name} must be a number of seconds")
    return timedelta(seconds=float(v))


def _percentile(sorted_vals: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return float("nan")
    k = max(1, math.ceil(p / 100.0 * len(sorted_vals)))
    return sorted_vals[min(k, len(sorted_vals)) - 1]


# ---------------------------------------------------------------------------
# OpenTelemetry (installed lazily, so benchmarks never pay for an SDK).
# ---------------------------------------------------------------------------


class _Otel:
    """The SDK provider samples only while a trace op runs (``recording()``).
    Outside them spans are non-recording, so later benchmarks in the same
    driver neither fill the in-memory exporter nor pay for span recording
    (they still see valid span contexts; use a fresh driver for clean runs)."""

    def __init__(self) -> None:
        self.ready = False
        self.exporter: Any = None
        self.tracer: Any = None
        self.sampler: Any = None

    def setup(self) -> None:
        if self.ready:
            return
        if _NO_OTEL or not sepp_otel.enabled():
            raise OtelUnavailable("OpenTelemetry is disabled (--no-otel) or not installed")
        try:
            from opentelemetry import trace
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )
            from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
        except ImportError as exc:
            raise OtelUnavailable(f"opentelemetry-sdk is not installed: {exc}") from exc

        class _ToggleSampler(Sampler):
            on = False

            def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
                return SamplingResult(Decision.RECORD_AND_SAMPLE if self.on else Decision.DROP)

            def get_description(self) -> str:
                return "seppy_driver toggle"

        self.sampler = _ToggleSampler()
        provider = TracerProvider(sampler=self.sampler)
        self.exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is not provider:
            raise OtelUnavailable("another TracerProvider was already installed")
        self.tracer = trace.get_tracer("seppy_driver")
        self.ready = True

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self.setup()
        self.exporter.clear()
        self.sampler.on = True
        try:
            yield
        finally:
            self.sampler.on = False

    def finished(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())


def _rss() -> dict[str, Any]:
    rss = None
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    rss = int(ln.split()[1]) * 1024
                    break
    except OSError:
        pass
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"rss_bytes": rss if rss is not None else max_rss, "max_rss_bytes": max_rss}


def _hex_trace(i: int) -> str:
    return f"{i:032x}"


def _hex_span(i: int) -> str:
    return f"{i:016x}"


def _span_json(span: Any) -> dict[str, Any]:
    sc = span.context
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": _hex_trace(sc.trace_id),
        "span_id": _hex_span(sc.span_id),
        "parent_span_id": _hex_span(span.parent.span_id) if span.parent is not None else None,
        "links": [
            {
                "trace_id": _hex_trace(link.context.trace_id),
                "span_id": _hex_span(link.context.span_id),
            }
            for link in span.links
        ],
    }


# ---------------------------------------------------------------------------
# The driver.
# ---------------------------------------------------------------------------


class Driver:
    def __init__(self, out: Any) -> None:
        self._out = out
        self.client: SeppClient | None = None
        # job_id -> {attempt: Job}; the most recently reserved attempt is last.
        self.jobs: dict[str, dict[int, Job]] = {}
        self.otel = _Otel()
        self.stop = False
        self.background: set[asyncio.Task[None]] = set()

    # -- plumbing ----------------------------------------------------------

    def write(self, obj: dict[str, Any]) -> None:
        try:
            line = json.dumps(obj, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            line = json.dumps(
                {
                    "id": obj.get("id"),
                    "ok": False,
                    "error": {"type": "DriverEncodeError", "message": str(exc)},
                }
            )
        self._out.write(line.encode("utf-8") + b"\n")
        self._out.flush()

    async def handle_line(self, line: bytes) -> None:
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise DriverError("a request must be a JSON object")
        except (ValueError, DriverError) as exc:
            self.write({"id": None, "ok": False, "error": encode_error(exc)})
            return
        if req.get("concurrent") and req.get("op") != "shutdown":
            task = asyncio.create_task(self.run_one(req))
            self.background.add(task)
            task.add_done_callback(self.background.discard)
        else:
            await self.run_one(req)

    async def run_one(self, req: dict[str, Any]) -> None:
        rid = req.get("id")
        op = req.get("op")
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        try:
            if fn is None:
                raise UnknownOp(f"unknown op {op!r}")
            result = await fn(req)
            resp: dict[str, Any] = {"id": rid, "ok": True, "result": result}
        except Exception as exc:
            resp = {"id": rid, "ok": False, "error": encode_error(exc)}
        self.write(resp)

    def need_client(self) -> SeppClient:
        if self.client is None:
            raise NotConnected("send a 'connect' request first")
        return self.client

    def lookup(self, req: dict[str, Any]) -> Job:
        job_id = req.get("job_id")
        by_attempt = self.jobs.get(job_id) if isinstance(job_id, str) else None
        if not by_attempt:
            raise DriverError(f"no reserved job with id {job_id!r} is known to this driver")
        attempt = req.get("attempt")
        if attempt is None:
            return next(reversed(by_attempt.values()))
        if attempt not in by_attempt:
            raise DriverError(f"job {job_id!r} was never reserved at attempt {attempt}")
        return by_attempt[attempt]

    def remember(self, jobs: list[Job]) -> None:
        for j in jobs:
            d = self.jobs.setdefault(j.ctx.id, {})
            d.pop(j.ctx.attempt, None)
            d[j.ctx.attempt] = j

    # -- basic ops -------------------------------------------------------------

    async def op_ping(self, req: dict[str, Any]) -> dict[str, Any]:
        import google.protobuf
        import grpc

        return {
            "pong": True,
            "sepp_py_version": SEPP_PY_VERSION,
            "sepp_module": sepp.__file__,
            "python": sys.version.split()[0],
            "executable": sys.executable,
            "grpcio": grpc.__version__,
            "protobuf": google.protobuf.__version__,
            "otel_api": sepp_otel.enabled(),
            "pid": os.getpid(),
            "connected": self.client is not None,
        }

    async def op_connect(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.client is not None:
            old, self.client = self.client, None
            await old.close()
        kw: dict[str, Any] = {}
        if req.get("api_key") is not None:
            kw["api_key"] = req["api_key"]
        if req.get("connect_timeout_s") is not None:
            kw["connect_timeout"] = _secs(req["connect_timeout_s"], "connect_timeout_s")
        if req.get("rpc_timeout_s") is not None:
            kw["rpc_timeout"] = _secs(req["rpc_timeout_s"], "rpc_timeout_s")
        if req.get("max_receive_message_bytes") is not None:
            kw["max_receive_message_bytes"] = int(req["max_receive_message_bytes"])
        if req.get("retry") is not None:
            r = req["retry"]
            rp: dict[str, Any] = {}
            if "max_attempts" in r:
                rp["max_attempts"] = int(r["max_attempts"])
            if "initial_backoff_s" in r:
                rp["initial_backoff"] = _secs(r["initial_backoff_s"], "initial_backoff_s")
            if "max_backoff_s" in r:
                rp["max_backoff"] = _secs(r["max_backoff_s"], "max_backoff_s")
            if "multiplier" in r:
                rp["multiplier"] = float(r["multiplier"])
            if "jitter" in r:
                rp["jitter"] = bool(r["jitter"])
            kw["retry_policy"] = RetryPolicy(**rp)
        self.client = await SeppClient.connect(req["addr"], **kw)
        self.jobs.clear()
        return {"connected": True}

    async def op_close(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.client is not None:
            old, self.client = self.client, None
            await old.close()
        return {}

    async def op_enqueue(self, req: dict[str, Any]) -> dict[str, Any]:
        client = self.need_client()
        ack = await client.enqueue(decode_enqueue_request(req))
        return encode_ack(ack)

    async def op_enqueue_batch(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        client = self.need_client()
        jobs = [decode_enqueue_request(j) for j in req["jobs"]]
        out: list[dict[str, Any]] = []
        for r in await client.enqueue_batch(jobs):
            if isinstance(r, sepp_errors.JobRejection):
                out.append({"rejection": encode_rejection(r)})
            else:
                out.append(encode_ack(r))
        return out

    async def op_enqueue_atomic(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        client = self.need_client()
        jobs = [decode_enqueue_request(j) for j in req["jobs"]]
        return [encode_ack(a) for a in await client.enqueue_atomic(jobs)]

    async def op_reserve(self, req: dict[str, Any]) -> list[dict[str, Any]] | None:
        client = self.need_client()
        opts = ReserveOptions(
            queues=list(req["queues"]),
            lease_duration=_secs(req["lease_s"], "lease_s"),
            wait_timeout=_secs(req.get("wait_s", 30), "wait_s"),
            worker_id=req.get("worker_id"),
            max_jobs=req.get("max_jobs"),
        )
        jobs = await client.reserve(opts)
        if jobs is None:
            return None
        self.remember(jobs)
        return [encode_job(j) for j in jobs]

    async def op_ack(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self.lookup(req)
        await self.need_client().ack(job.ctx)
        return {}

    async def op_nack(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self.lookup(req)
        dead = await self.need_client().nack(
            job.ctx, decode_retry(req.get("retry")), req.get("reason") or ""
        )
        return {"dead_lettered": dead}

    async def op_extend(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self.lookup(req)
        self.need_client()
        expiry = await job.ctx.extend(_secs(req["lease_s"], "lease_s"))
        return {"lease_expires_at": _iso(expiry)}

    async def op_forget_jobs(self, req: dict[str, Any]) -> dict[str, Any]:
        n = len(self.jobs)
        self.jobs.clear()
        return {"forgotten": n}

    async def op_drain_dead_letters(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        client = self.need_client()
        records = await client.drain_dead_letters(req.get("queue"), int(req.get("max", 1)))
        return [encode_dead_letter(r) for r in records]

    async def op_get_server_info(self, req: dict[str, Any]) -> dict[str, Any]:
        info = await self.need_client().get_server_info()
        return to_jsonable(info)

    async def op_rss(self, req: dict[str, Any]) -> dict[str, Any]:
        return _rss()

    async def op_shutdown(self, req: dict[str, Any]) -> dict[str, Any]:
        self.stop = True
        if self.client is not None:
            old, self.client = self.client, None
            await old.close()
        return {}

    # -- benchmarks ------------------------------------------------------------

    @staticmethod
    def _bench_payload(size: int) -> Payload | None:
        return Payload(b"x" * size, "application/octet-stream") if size > 0 else None

    async def op_bench_enqueue(self, req: dict[str, Any]) -> dict[str, Any]:
        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        concurrency = max(1, int(req.get("concurrency", 1)))
        payload = self._bench_payload(int(req.get("payload_size", 0)))
        job_type = req.get("job_type", "bench")
        remaining = [n]

        async def producer() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                await client.enqueue(EnqueueRequest(queue, job_type, payload=payload))

        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(min(concurrency, max(n, 1)))))
        t1, c1 = time.perf_counter(), time.process_time()
        return {"elapsed_s": t1 - t0, "cpu_s": c1 - c0, "n": n}

    async def op_enqueue_count(self, req: dict[str, Any]) -> dict[str, Any]:
        """``n`` single enqueues from ``concurrency`` tasks, payloads ``<prefix>-<i>``, even
        ones keyed with their payload; failures are counted, not raised. ``signal_at``
        (``{pid, signum, after: [counts]}``) sends a signal once that many calls have ended
        (the proxy comparison reloads nginx this way, at the same points for both clients)."""
        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        concurrency = max(1, int(req.get("concurrency", 1)))
        prefix = req.get("prefix", "job")
        signal_at = req.get("signal_at") or {}
        marks = sorted(int(a) for a in signal_at.get("after", ()))
        indexes = iter(range(n))
        ended = [0]
        errors: dict[str, int] = {}

        async def producer() -> None:
            for i in indexes:
                data = f"{prefix}-{i}".encode()
                key = data.decode() if i % 2 == 0 else None
                try:
                    await client.enqueue(
                        EnqueueRequest(
                            queue,
                            "proxied",
                            payload=Payload(data, "application/octet-stream"),
                            idempotency_key=key,
                        )
                    )
                except Exception as exc:
                    name = f"{type(exc).__name__}: {str(exc)[:80]}"
                    errors[name] = errors.get(name, 0) + 1
                ended[0] += 1
                while marks and ended[0] >= marks[0]:
                    marks.pop(0)
                    os.kill(int(signal_at["pid"]), int(signal_at["signum"]))

        t0 = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(min(concurrency, max(n, 1)))))
        return {
            "n": n,
            "failed": sum(errors.values()),
            "errors": errors,
            "elapsed_s": time.perf_counter() - t0,
        }

    async def op_bench_enqueue_batch(self, req: dict[str, Any]) -> dict[str, Any]:
        client = self.need_client()
        queue = req["queue"]
        n_batches, batch_size = int(req["n_batches"]), int(req["batch_size"])
        concurrency = max(1, int(req.get("concurrency", 1)))
        payload = self._bench_payload(int(req.get("payload_size", 0)))
        job_type = req.get("job_type", "bench")
        remaining = [n_batches]
        rejected = [0]

        async def producer() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                batch = [
                    EnqueueRequest(queue, job_type, payload=payload) for _ in range(batch_size)
                ]
                res = await client.enqueue_batch(batch)
                rejected[0] += sum(isinstance(r, sepp_errors.JobRejection) for r in res)

        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(min(concurrency, max(n_batches, 1)))))
        t1, c1 = time.perf_counter(), time.process_time()
        if rejected[0]:
            raise DriverError(f"{rejected[0]} job(s) were rejected during bench_enqueue_batch")
        return {"elapsed_s": t1 - t0, "cpu_s": c1 - c0, "n": n_batches * batch_size}

    async def op_bench_drain_raw(self, req: dict[str, Any]) -> dict[str, Any]:
        """Reserve (max_jobs = free slots) + one ack per job, at most ``in_flight``
        jobs held at once. The queue must already hold ``n`` jobs."""
        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        in_flight = max(1, int(req.get("in_flight", 16)))
        lease = _secs(req.get("lease_s", 30), "lease_s")
        wait = _secs(req.get("wait_s", 1), "wait_s")
        timeout_s = float(req.get("timeout_s", 300))
        max_batch = (await client.get_server_info()).max_reserve_batch or in_flight

        free = [in_flight]
        cond = asyncio.Condition()
        tasks: set[asyncio.Task[None]] = set()
        failures: list[BaseException] = []

        async def ack_one(job: Job) -> None:
            try:
                await client.ack(job.ctx)
            except Exception as exc:
                failures.append(exc)
            async with cond:
                free[0] += 1
                cond.notify_all()

        reserved = 0
        c0, t0 = time.process_time(), time.perf_counter()
        deadline = t0 + timeout_s
        while reserved < n:
            if failures:
                break
            async with cond:
                await cond.wait_for(lambda: free[0] > 0)
                k = min(free[0], n - reserved, max_batch)
                free[0] -= k
            if time.perf_counter() > deadline:
                raise DriverError(f"bench_drain_raw timed out after {reserved}/{n} jobs")
            jobs = await client.reserve(
                ReserveOptions([queue], lease, wait_timeout=wait, max_jobs=k)
            )
            got = len(jobs) if jobs else 0
            async with cond:
                free[0] += k - got
            reserved += got
            for job in jobs or ():
                t = asyncio.create_task(ack_one(job))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*list(tasks))
        t1, c1 = time.perf_counter(), time.process_time()
        if failures:
            raise failures[0]
        return {"elapsed_s": t1 - t0, "cpu_s": c1 - c0, "n": reserved}

    async def op_bench_drain_worker(self, req: dict[str, Any]) -> dict[str, Any]:
        """sepp-py's Worker (catch-all handler that just returns) until ``n``
        handlers have returned; ``run()`` then drains the in-flight acks."""
        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        max_in_flight = int(req.get("max_in_flight", 16))
        lease = _secs(req.get("lease_s", 30), "lease_s")
        timeout_s = float(req.get("timeout_s", 300))
        worker = Worker(
            client,
            [queue],
            lease,
            max_in_flight=max_in_flight,
            wait_timeout=_secs(req.get("wait_s", 5), "wait_s"),
        )
        handle = worker.shutdown_handle()
        done = [0]

        async def handler(payload: Payload | None, ctx: JobCtx) -> None:
            done[0] += 1
            if done[0] >= n:
                handle.shutdown()

        worker.catch_all(handler)
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            await asyncio.wait_for(worker.run(), timeout_s)
        except asyncio.TimeoutError:
            raise DriverError(f"bench_drain_worker timed out after {done[0]}/{n} jobs") from None
        t1, c1 = time.perf_counter(), time.process_time()
        return {"elapsed_s": t1 - t0, "cpu_s": c1 - c0, "n": done[0]}

    async def op_bench_latency(self, req: dict[str, Any]) -> dict[str, Any]:
        """Sequential enqueue -> handler-start latency with a running Worker.
        Timed from just before ``enqueue`` to the first line of the handler."""
        client = self.need_client()
        queue, n = req["queue"], int(req["n"])
        warmup = int(req.get("warmup", 0))
        per_job_timeout = float(req.get("timeout_s", 10))
        payload = self._bench_payload(int(req.get("payload_size", 16)))
        worker = Worker(
            client,
            [queue],
            _secs(req.get("lease_s", 30), "lease_s"),
            max_in_flight=int(req.get("max_in_flight", 16)),
            wait_timeout=_secs(req.get("wait_s", 30), "wait_s"),
        )
        waiting: dict[str, asyncio.Future[float]] = {}

        async def handler(payload: Payload | None, ctx: JobCtx) -> None:
            t = time.perf_counter()
            key = ctx.custom.get("lat_key")
            fut = waiting.get(key) if isinstance(key, str) else None
            if fut is not None and not fut.done():
                fut.set_result(t)

        worker.catch_all(handler)
        run_task = asyncio.create_task(worker.run())
        samples: list[float] = []
        try:
            await asyncio.sleep(0.05)  # let the worker park its first reserve
            for i in range(warmup + n):
                key = f"lat-{os.getpid()}-{i}"
                fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
                waiting[key] = fut
                t0 = time.perf_counter()
                await client.enqueue(
                    EnqueueRequest(queue, "latency", payload=payload, custom={"lat_key": key})
                )
                try:
                    t1 = await asyncio.wait_for(fut, per_job_timeout)
                except asyncio.TimeoutError:
                    raise DriverError(f"job {i} never reached the handler") from None
                del waiting[key]
                if i >= warmup:
                    samples.append((t1 - t0) * 1000.0)
        finally:
            worker.shutdown_handle().shutdown()
            try:
                await asyncio.wait_for(run_task, 30)
            except asyncio.TimeoutError:
                run_task.cancel()
        s = sorted(samples)
        out: dict[str, Any] = {
            "p50_ms": _percentile(s, 50),
            "p99_ms": _percentile(s, 99),
            "mean_ms": sum(s) / len(s) if s else float("nan"),
            "min_ms": s[0] if s else float("nan"),
            "max_ms": s[-1] if s else float("nan"),
            "n": len(s),
        }
        if req.get("return_samples"):
            out["samples_ms"] = samples
        return {k: _encode_float(v) if isinstance(v, float) else v for k, v in out.items()}

    # -- worker / tracing ops -----------------------------------------------------

    async def _process_one(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run sepp-py's Worker until it has processed exactly one job.

        ``outcome`` picks what the handler does: "ack" (return, default),
        "retry" / "retry_after" (with ``after_s``) / "permanent" (raise the
        HandlerError of that name with ``reason``), or "raise" (a RuntimeError).
        """
        client = self.need_client()
        timeout_s = float(req.get("timeout_s", 10))
        outcome = req.get("outcome", "ack")
        reason = req.get("reason", "driver")
        worker = Worker(
            client,
            list(req["queues"]) if "queues" in req else [req["queue"]],
            _secs(req.get("lease_s", 30), "lease_s"),
            max_in_flight=1,
            max_jobs=1,
            wait_timeout=_secs(min(timeout_s, float(req.get("wait_s", 30))), "wait_s"),
        )
        handle = worker.shutdown_handle()
        seen: list[dict[str, Any]] = []

        async def handler(payload: Payload | None, ctx: JobCtx) -> None:
            info: dict[str, Any] = {
                "job": encode_job(Job(payload, ctx)),
                "handler_span": None,
            }
            if self.otel.ready and self.otel.sampler.on:
                from opentelemetry import trace

                sc = trace.get_current_span().get_span_context()
                if sc.is_valid:
                    info["handler_span"] = {
                        "trace_id": _hex_trace(sc.trace_id),
                        "span_id": _hex_span(sc.span_id),
                    }
            seen.append(info)
            handle.shutdown()
            if outcome == "ack":
                return
            if outcome == "retry":
                raise HandlerError.retry(reason)
            if outcome == "retry_after":
                raise HandlerError.retry_after(
                    reason, timedelta(seconds=float(req.get("after_s", 1)))
                )
            if outcome == "permanent":
                raise HandlerError.permanent(reason)
            if outcome == "raise":
                raise RuntimeError(reason)
            raise DriverError(f"unknown outcome {outcome!r}")

        worker.catch_all(handler)
        run_task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(asyncio.shield(run_task), timeout_s)
        except asyncio.TimeoutError:
            handle.shutdown()
            await asyncio.wait_for(run_task, 30)
            if not seen:
                raise TimeoutError(f"no job arrived within {timeout_s}s") from None
        if not seen:
            raise DriverError("worker stopped without processing a job")
        result = seen[0]
        result["processed"] = len(seen)
        result["outcome"] = outcome
        return result

    async def op_process_one(self, req: dict[str, Any]) -> dict[str, Any]:
        return await self._process_one(req)

    async def op_otel_setup(self, req: dict[str, Any]) -> dict[str, Any]:
        self.otel.setup()
        return {"ready": True}

    async def op_enqueue_in_span(self, req: dict[str, Any]) -> dict[str, Any]:
        client = self.need_client()
        span_name = req.get("span_name", "seppy_driver.produce")
        with self.otel.recording():
            with self.otel.tracer.start_as_current_span(span_name) as span:
                sc = span.get_span_context()
                ack = await client.enqueue(decode_enqueue_request(req))
            enqueue_spans = [
                _span_json(s)
                for s in self.otel.finished()
                if s.name == "sepp.enqueue" and s.context.trace_id == sc.trace_id
            ]
        return {
            **encode_ack(ack),
            "trace_id": _hex_trace(sc.trace_id),
            "span_id": _hex_span(sc.span_id),
            # The job's trace_context points at sepp-py's CLIENT span (a child
            # of span_name), not at span_name itself.
            "enqueue_span_id": enqueue_spans[0]["span_id"] if enqueue_spans else None,
        }

    async def op_process_one_traced(self, req: dict[str, Any]) -> dict[str, Any]:
        with self.otel.recording():
            result = await self._process_one(req)
            process = [_span_json(s) for s in self.otel.finished() if s.name == "sepp.process"]
        if not process:
            raise DriverError("sepp-py's Worker emitted no 'sepp.process' span")
        p = process[0]
        result["process_span"] = p
        result["link_trace_ids"] = [link["trace_id"] for link in p["links"]]
        result["links"] = p["links"]
        return result


async def amain() -> int:
    # Keep the real stdout for protocol lines only; anything else that writes to
    # fd 1 (print, C libraries) goes to stderr instead.
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    if SEPP_PY_VERSION != _EXPECTED_SEPP_PY:
        sys.stderr.write(
            f"seppy_driver: warning: expected sepp-py {_EXPECTED_SEPP_PY}, "
            f"found {SEPP_PY_VERSION}\n"
        )

    driver = Driver(proto_out)
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[bytes] = asyncio.Queue()

    def read_stdin() -> None:
        # A daemon thread reading the raw fd: a read still blocked at exit must
        # neither hold the interpreter open nor hold sys.stdin's buffer lock
        # (CPython aborts at finalization if a daemon thread owns it). b"" = EOF.
        pending: list[bytes] = []  # pieces of a line not yet terminated
        while True:
            try:
                chunk = os.read(0, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                if pending:
                    loop.call_soon_threadsafe(lines.put_nowait, b"".join(pending))
                loop.call_soon_threadsafe(lines.put_nowait, b"")
                return
            if b"\n" not in chunk:
                pending.append(chunk)
                continue
            first, *rest = chunk.split(b"\n")
            complete = [b"".join([*pending, first]), *rest[:-1]]
            pending = [rest[-1]] if rest[-1] else []
            for line in complete:
                loop.call_soon_threadsafe(lines.put_nowait, line + b"\n")

    threading.Thread(target=read_stdin, name="seppy-driver-stdin", daemon=True).start()
    try:
        while not driver.stop:
            line = await lines.get()
            if not line:
                break
            if not line.strip():
                continue
            await driver.handle_line(line)
    finally:
        for t in list(driver.background):
            t.cancel()
        if driver.background:
            await asyncio.gather(*driver.background, return_exceptions=True)
        if driver.client is not None:
            await driver.client.close()
    return 0


def main() -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("SEPPY_DRIVER_LOG_LEVEL", "WARNING").upper(),
        format="seppy_driver %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(amain())


if __name__ == "__main__":
    raise SystemExit(main())
