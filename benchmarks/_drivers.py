"""The client processes the harness talks to: one JSON-lines driver per client under test."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
BENCH_DIR = REPO / "benchmarks"
SEPPY_DRIVER = REPO / "tests" / "peers" / "seppy_driver.py"
PROBE = BENCH_DIR / "_probe.py"
TRIO_DRIVER = BENCH_DIR / "trio_driver.py"
RS_CRATE = BENCH_DIR / "sepp-rs-bench"

SEPP_TRIO = "sepp-trio"
SEPP_PY = "sepp-py"
SEPP_RS = "sepp-rs"
# A Python client's second driver with opentelemetry importable and no provider set: what an
# application that has opentelemetry-api through some other dependency gets.
OTEL_API = "otel-api"


class DriverFailed(RuntimeError):
    """A driver answered ok=false, died, or did not answer in time."""


@dataclass
class ClientSpec:
    """How to start one client's driver and probes."""

    name: str
    driver_argv: list[str]
    probe_argv: list[str] | None  # prefix for benchmarks/_probe.py (None: no probes)
    env: dict[str, str] = field(default_factory=dict)


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment minus what could change which code a driver imports."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(extra or {})
    return env


PURE_PROTOBUF = "pure-protobuf"


def trio_spec(python: str, *, otel: bool, experiment: str | None = None) -> ClientSpec:
    """sepp-trio's driver; with `experiment`, a variant running benchmarks/experiments.py
    patches (named ``sepp-trio+<experiment>``, and without probes); the experiment OTEL_API
    is the driver with opentelemetry importable. The `pure-protobuf` variant is no patch: the
    same code on protobuf's pure-Python implementation, as on a platform without protobuf
    wheels."""
    flags = [] if otel else ["--no-otel"]
    env = _clean_env()
    if experiment == OTEL_API:
        flags = []
    elif experiment == PURE_PROTOBUF:
        env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    elif experiment:
        flags += ["--experiment", experiment]
    return ClientSpec(
        f"{SEPP_TRIO}+{experiment}" if experiment else SEPP_TRIO,
        [python, str(TRIO_DRIVER), *flags, "--src", str(SRC)],
        None if experiment else [python, str(PROBE)],
        env,
    )


def seppy_spec(python: str, *, otel: bool, otel_api_variant: bool = False) -> ClientSpec:
    """sepp-py's driver; `otel_api_variant` is its OTEL_API second driver (without probes)."""
    flags = [] if otel or otel_api_variant else ["--no-otel"]
    return ClientSpec(
        f"{SEPP_PY}+{OTEL_API}" if otel_api_variant else SEPP_PY,
        [python, "-I", str(SEPPY_DRIVER), *flags],
        None if otel_api_variant else [python, "-I", str(PROBE)],
        _clean_env(),
    )


def rs_spec(binary: str) -> ClientSpec:
    return ClientSpec(SEPP_RS, [binary], None, _clean_env())


def probe_args(spec: ClientSpec, what: str, *args: str, otel: bool) -> list[str]:
    assert spec.probe_argv is not None
    argv = [*spec.probe_argv, what, *args]
    if not otel:
        argv.append("--no-otel")
    if spec.name == SEPP_TRIO:
        argv += ["--src", str(SRC)]
    return argv


def results_header(what: str, command: str) -> str:
    """How a results block starts: when, on what machine under what load, and the command."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    return (
        f"Run {stamp} on {os.cpu_count()} CPUs, load average {load:.2f} at the end, {what}."
        f"\n\nCommand: `{command}`\n\n"
    )


def replace_marked(path: Path, start: str, end: str, text: str) -> None:
    """Put `text` between the lines `start` and `end` of the file at `path`."""
    before, _, rest = path.read_text().partition(start)
    _, _, after = rest.partition(end)
    path.write_text(f"{before}{start}\n{text}{end}{after}")


async def run_json(argv: Sequence[str], env: Mapping[str, str], timeout: float = 120) -> Any:
    """Run a command that prints one JSON line; return it parsed."""
    with trio.fail_after(timeout):
        proc = await trio.run_process(
            list(argv), capture_stdout=True, capture_stderr=True, env=dict(env), check=False
        )
    if proc.returncode != 0:
        stderr = proc.stderr.decode(errors="replace")[-2000:]
        raise DriverFailed(f"{argv!r} exited with {proc.returncode}: {stderr}")
    lines = [ln for ln in proc.stdout.decode().splitlines() if ln.strip()]
    return json.loads(lines[-1])


class DriverProcess:
    """A running driver: send one request, wait for its one-line answer."""

    def __init__(self, spec: ClientSpec, log_path: Path) -> None:
        self.spec = spec
        self.name = spec.name
        self.log_path = log_path
        self._proc: trio.Process | None = None
        self._log: Any = None
        self._buffer = b""
        self._next_id = 0

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # A local log file, opened once per driver; closed in aclose().
        self._log = open(self.log_path, "ab")  # noqa: ASYNC230
        self._proc = await trio.lowlevel.open_process(
            self.spec.driver_argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=self.spec.env,
            cwd=str(REPO),
        )

    def _log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-3000:]

    async def request(self, op: str, timeout: float = 600, **args: Any) -> Any:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise DriverFailed(f"{self.name}: driver not started")
        self._next_id += 1
        rid = self._next_id
        line = json.dumps({"id": rid, "op": op, **args}).encode() + b"\n"
        try:
            with trio.fail_after(timeout):
                await proc.stdin.send_all(line)
                while b"\n" not in self._buffer:
                    chunk = await proc.stdout.receive_some(1 << 16)
                    if not chunk:
                        raise DriverFailed(
                            f"{self.name}: driver exited during {op!r}\n{self._log_tail()}"
                        )
                    self._buffer += chunk
        except trio.TooSlowError:
            raise DriverFailed(f"{self.name}: no answer to {op!r} within {timeout}s") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise DriverFailed(f"{self.name}: driver pipe broke during {op!r}: {exc}") from None
        raw, _, self._buffer = self._buffer.partition(b"\n")
        reply = json.loads(raw)
        if reply.get("id") != rid:
            raise DriverFailed(f"{self.name}: answer id {reply.get('id')} for request {rid}")
        if not reply.get("ok"):
            err = reply.get("error", {})
            raise DriverFailed(
                f"{self.name}: {op} failed: {err.get('type')}: {err.get('message')}"
                + (f"\n{err['traceback']}" if err.get("traceback") else "")
            )
        return reply.get("result")

    async def aclose(self) -> None:
        proc = self._proc
        self._proc = None
        if proc is not None:
            with trio.CancelScope(shield=True):
                try:
                    with trio.move_on_after(10):
                        if proc.stdin is not None:
                            line = json.dumps({"id": 0, "op": "shutdown"}).encode() + b"\n"
                            try:
                                await proc.stdin.send_all(line)
                                await proc.stdin.aclose()
                            except (trio.BrokenResourceError, trio.ClosedResourceError):
                                pass
                        await proc.wait()
                finally:
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
