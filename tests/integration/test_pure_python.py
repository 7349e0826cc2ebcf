"""The runtime needs no native code: a full round trip runs in a Python where every extension
module outside the interpreter's own standard library cannot be imported.

A prelude installs a meta-path finder that refuses any extension module (ExtensionFileLoader)
outside the interpreter's standard library (CPython's lib-dynload; PyPy keeps its cffi modules
beside the stdlib's .py files), as on a platform without wheels for them. After the round trip
the script reports every extension module loaded and where from; the test asserts none came
from outside the standard library and that protobuf ran its pure-Python implementation. The
same script without the finder must report pydantic-core's extension (a dev dependency with
wheels everywhere the suite runs) and, where its wheel installs, protobuf's upb: that proves
the report sees native code when it is there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from sepp.testing import SeppServer

SRC = Path(__file__).resolve().parents[2] / "src"
# upb has wheels for CPython with the GIL only: not for PyPy, not for free-threaded builds.
UPB = importlib.util.find_spec("google._upb") is not None

PRELUDE = r"""
import importlib.abc, importlib.machinery, os, site, sys, sysconfig

def _dirs(paths):
    return tuple(os.path.realpath(p) + os.sep for p in set(paths) if p)

STDLIB_NATIVE = _dirs([
    sysconfig.get_config_var("DESTSHARED") or "",
    os.path.join(os.path.dirname(os.__file__), "lib-dynload"),
    sysconfig.get_path("stdlib"),
    sysconfig.get_path("platstdlib"),
])
# An interpreter's own site-packages may lie inside its stdlib directory: never the stdlib.
SITE = _dirs(
    [*site.getsitepackages(), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
)
REFUSED = []


def is_stdlib_native(origin):
    where = os.path.realpath(origin)
    return where.startswith(STDLIB_NATIVE) and not where.startswith(SITE)


class RefuseForeignNativeCode(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if isinstance(spec.loader, importlib.machinery.ExtensionFileLoader) and not (
            is_stdlib_native(spec.origin)
        ):
            REFUSED.append(name)
            raise ModuleNotFoundError(f"native extension refused: {spec.origin}", name=name)
        return spec


if os.environ.get("SEPP_TEST_REFUSE_NATIVE") == "1":
    sys.meta_path.insert(0, RefuseForeignNativeCode())
"""

SCRIPT = r"""
import importlib, importlib.machinery, json, os, sys
import trio, sepp
from google.protobuf.internal import api_implementation

for also in filter(None, os.environ.get("SEPP_TEST_ALSO_IMPORT", "").split(",")):
    importlib.import_module(also)

async def main(address):
    async with sepp.open(address) as client:
        ack = await client.enqueue("pure", "t", payload=sepp.Payload.json({"n": 1}))
        jobs = await client.reserve("pure", wait_timeout=2)
        await client.ack(jobs[0].ctx)
        return ack.job_id == jobs[0].id

ok = trio.run(main, sys.argv[1])
native = {
    name: module.__spec__.origin
    for name, module in list(sys.modules.items())
    if isinstance(getattr(getattr(module, "__spec__", None), "loader", None),
                  importlib.machinery.ExtensionFileLoader)
}
print(json.dumps({
    "ok": ok,
    "protobuf": api_implementation.Type(),
    "grpc": sorted(n for n in sys.modules if n == "grpc" or n.startswith("grpc.")),
    "stdlib_native": sorted(n for n, origin in native.items() if is_stdlib_native(origin)),
    "foreign_native": sorted(n for n, origin in native.items() if not is_stdlib_native(origin)),
    "refused": sorted(REFUSED),
}))
"""


async def round_trip(address: str, **env: str) -> dict[str, Any]:
    """Run the round trip in a fresh interpreter (this checkout's sources); its report."""
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    environ.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
    environ.update(env)
    with trio.fail_after(60):
        out = await trio.run_process(
            [sys.executable, "-c", PRELUDE + SCRIPT, address],
            env=environ,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert out.returncode == 0, out.stderr.decode()
    report: dict[str, Any] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    return report


@pytest.mark.parametrize(
    "env",
    [{}, {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}],
    ids=["no-wheels", "python-requested"],
)
@pytest.mark.arch_smoke
async def test_round_trip_loads_no_native_code_outside_the_standard_library(
    env: dict[str, str], sepp_server: SeppServer
) -> None:
    report = await round_trip(sepp_server.address, SEPP_TEST_REFUSE_NATIVE="1", **env)
    assert report["ok"] is True
    assert report["protobuf"] == "python"
    assert report["grpc"] == []
    assert report["foreign_native"] == []
    # protobuf probes its upb extension even when told to use pure Python; it was refused.
    assert ("google._upb._message" in report["refused"]) is UPB
    assert report["stdlib_native"], "the standard library's own extensions load as usual"


async def test_the_report_sees_native_code_when_it_is_loaded(sepp_server: SeppServer) -> None:
    # No guard: protobuf picks upb where it is installed.
    report = await round_trip(sepp_server.address, SEPP_TEST_ALSO_IMPORT="pydantic_core")
    assert report["ok"] is True
    assert "pydantic_core._pydantic_core" in report["foreign_native"]
    assert report["protobuf"] == ("upb" if UPB else "python")
    assert ("google._upb._message" in report["foreign_native"]) is UPB
    assert report["stdlib_native"]
    assert report["refused"] == []
