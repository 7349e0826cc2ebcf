"""The runtime needs no native code: pure-Python protobuf, no grpc, no third-party extension."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import trio

from sepp.testing import SeppServer

SRC = Path(__file__).resolve().parents[2] / "src"
SCRIPT = r"""
import importlib.machinery, json, sys, sysconfig
import trio, sepp
from google.protobuf.internal import api_implementation

async def main(address):
    async with sepp.open(address) as client:
        ack = await client.enqueue("pure", "t", payload=sepp.Payload.json({"n": 1}))
        jobs = await client.reserve("pure", wait_timeout=2)
        await client.ack(jobs[0].ctx)
        return ack.job_id == jobs[0].id

ok = trio.run(main, sys.argv[1])
stdlib = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
native = sorted(
    name for name, mod in list(sys.modules.items())
    if (getattr(mod, "__file__", None) or "").endswith(suffixes)
    and not any(mod.__file__.startswith(p) for p in stdlib)
)
print(json.dumps({
    "ok": ok,
    "protobuf": api_implementation.Type(),
    "grpc": sorted(n for n in sys.modules if n == "grpc" or n.startswith("grpc.")),
    "native": native,
}))
"""


async def test_round_trip_with_pure_python_protobuf_loads_no_native_code(
    sepp_server: SeppServer,
) -> None:
    src = SRC
    env = {
        **os.environ,
        "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python",
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    with trio.fail_after(60):
        out = await trio.run_process(
            [sys.executable, "-c", SCRIPT, sepp_server.address],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
        )
    report = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert report == {"ok": True, "protobuf": "python", "grpc": [], "native": []}, out.stderr
