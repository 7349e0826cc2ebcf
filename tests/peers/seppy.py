"""Drive the official sepp-py client (its own venv, a subprocess) from trio tests."""

from __future__ import annotations

import base64
import itertools
import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "seppy_driver.py"


class SeppyError(Exception):
    """sepp-py raised; `type` is its exception class name."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('type')}: {error.get('message')}")
        self.type = str(error.get("type"))
        self.data = error


def seppy_python() -> str:
    """The sepp-py venv's python; builds the venv when needed (fails loudly, never skips)."""
    found = os.environ.get("SEPPY_PYTHON")
    if found and Path(found).exists():
        return found
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-seppy-venv.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    python = out.stdout.strip().splitlines()[-1]
    os.environ["SEPPY_PYTHON"] = python
    return python


class SeppyDriver:
    def __init__(self, process: trio.Process) -> None:
        self._process = process
        self._ids = itertools.count(1)
        self._buffer = b""

    async def call(self, op: str, **args: Any) -> Any:
        request_id = next(self._ids)
        line = json.dumps({"op": op, "id": request_id, **args}) + "\n"
        assert self._process.stdin is not None and self._process.stdout is not None
        await self._process.stdin.send_all(line.encode())
        while b"\n" not in self._buffer:
            chunk = await self._process.stdout.receive_some(65536)
            if not chunk:
                raise RuntimeError(f"sepp-py driver exited during {op!r}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\n", 1)
        reply = json.loads(raw)
        assert reply.get("id") == request_id, reply
        if not reply["ok"]:
            raise SeppyError(reply["error"])
        return reply.get("result")


@asynccontextmanager
async def seppy_driver(address: str) -> AsyncIterator[SeppyDriver]:
    python = await trio.to_thread.run_sync(seppy_python)
    process = await trio.lowlevel.open_process(
        [python, "-I", str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        driver = SeppyDriver(process)
        with trio.fail_after(30):
            await driver.call("connect", addr=address)
        yield driver
    finally:
        with trio.move_on_after(5) as scope:
            scope.shield = True
            try:
                await driver.call("shutdown")
            except Exception:
                pass
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def typed_custom(custom: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in custom.items():
        if isinstance(value, bool):
            out[key] = {"t": "b", "v": value}
        elif isinstance(value, int):
            out[key] = {"t": "i", "v": str(value)}
        elif isinstance(value, float):
            out[key] = {"t": "d", "v": value}
        else:
            out[key] = {"t": "s", "v": value}
    return out


def untyped_custom(custom: dict[str, dict[str, Any]]) -> dict[str, Any]:
    decode = {"b": bool, "i": int, "d": float, "s": str}
    return {k: decode[v["t"]](v["v"]) for k, v in custom.items()}
