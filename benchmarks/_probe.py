"""Fresh-interpreter probes, run by both clients' interpreters (never imported by the harness).

    python benchmarks/_probe.py import [--after MODULE] [--no-otel] [--src DIR]
    python benchmarks/_probe.py idle ADDR [--no-otel] [--src DIR]

``import`` prints ``{"import_s": ..., "import_cpu_s": ...}``: the wall and CPU time of ``import
sepp`` in this interpreter (CPU time is the steadier figure on a shared machine);
with ``--after MODULE``, MODULE (the client's event loop library) is imported first, untimed,
so the figure is what sepp adds for an application that already uses that library.
``idle`` imports sepp, connects to ADDR, makes one GetServerInfo call, lets the connection
settle, and prints ``{"rss_bytes": ...}`` (VmRSS) plus the RSS measured just before ``import
sepp`` (``base_rss_bytes``) and ``first_call_s``: the wall time from before ``import sepp``
until that first call returned (the harness subtracts ``import_s``: what is deferred from
import to first use shows up in the rest).

The same file serves sepp-trio (trio) and sepp-py (asyncio + grpcio): it tells them apart by
what ``import sepp`` gives (sepp-py has ``SeppClient``). Run sepp-py's interpreter with ``-I``
so that a ``PYTHONPATH`` pointing at this repository's ``src`` cannot shadow it; pass sepp-trio
the checkout with ``--src``.
"""

from __future__ import annotations

import sys
import time

_ARGS = sys.argv[1:]


class _BlockOtel:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by --no-otel)")
        return None


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


def _emit(obj: dict[str, object]) -> None:
    import json

    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    if "--no-otel" in _ARGS:
        sys.meta_path.insert(0, _BlockOtel())
    # Never let this script's own directory shadow anything.
    if sys.path and sys.path[0].endswith("benchmarks"):
        del sys.path[0]
    if "--src" in _ARGS:
        sys.path.insert(0, _ARGS[_ARGS.index("--src") + 1])

    what = _ARGS[0]
    if "--after" in _ARGS:
        __import__(_ARGS[_ARGS.index("--after") + 1])
    base_rss = _rss_bytes()
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    import sepp

    import_s = time.perf_counter() - t0
    import_cpu_s = time.process_time() - cpu0
    if what == "import":
        _emit({"import_s": import_s, "import_cpu_s": import_cpu_s})
        return 0
    if what != "idle":
        raise SystemExit(f"unknown probe {what!r}")
    addr = _ARGS[1]
    first_call_s: list[float] = []
    if hasattr(sepp, "SeppClient"):  # sepp-py
        import asyncio

        async def idle_py() -> int:
            client = await sepp.SeppClient.connect(addr)  # type: ignore[attr-defined]
            try:
                await client.get_server_info()
                first_call_s.append(time.perf_counter() - t0)
                await asyncio.sleep(0.3)
                return _rss_bytes()
            finally:
                await client.close()

        rss = asyncio.run(idle_py())
    else:  # sepp-trio
        import trio

        async def idle_trio() -> int:
            async with sepp.open(addr) as client:
                await client.get_server_info()
                first_call_s.append(time.perf_counter() - t0)
                await trio.sleep(0.3)
                return _rss_bytes()

        rss = trio.run(idle_trio)
    _emit(
        {
            "rss_bytes": rss,
            "base_rss_bytes": base_rss,
            "import_s": import_s,
            "first_call_s": first_call_s[0],
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
