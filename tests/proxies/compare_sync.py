"""Failed calls through the same proxies: sepp.SyncClient against grpcio's blocking client.

    SEPPY_PYTHON=... PYTHONPATH=src:tests .venv/bin/python tests/proxies/compare_sync.py
        [--runs 3] [--only nginx-reload] [--with-async]

Not a test: the blocking twin of compare_seppy.py, over its scenarios and one more (TLS ended
at nginx, reloaded every 100 calls; a fresh sepp server and proxy per client and run, reloads
at the same call counts), with threads in place of tasks:
each thread makes single enqueues on one shared client, both clients with their defaults (no
retry policy). grpcio runs in sepp-py's python (grpcio_blocking_load.py). A row shows failed
calls per run, then what arrived on the server (missing / duplicated jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import trio
from compare_seppy import SCENARIOS, Scenario, compare
from fixtures.proxy_load import QUEUE, Load, enqueue_through
from fixtures.proxy_load_sync import enqueue_through_sync
from peers.seppy import seppy_python

GRPCIO_LOAD = Path(__file__).resolve().parent / "grpcio_blocking_load.py"
TLS_KEY = "nginx-tls-reload"
SYNC_SCENARIOS = [
    *SCENARIOS,
    Scenario(
        TLS_KEY,
        "nginx, TLS ended there, keepalive_requests 100, reloaded every 100 calls",
        4000,
        64,
        keepalive_requests=100,
        reload_after=tuple(range(100, 4000, 100)),
    ),
]


def _address(scenario: Scenario, proxy: Any) -> str:
    if scenario.key == TLS_KEY:
        return str(proxy.tls_address)
    return str(getattr(proxy, "h2c_address", None) or proxy.address)


async def run_sync_client(scenario: Scenario, proxy: Any) -> Counter[str]:
    load = Load()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(load.reload_at, proxy, scenario.reload_after)
        await trio.to_thread.run_sync(
            lambda: enqueue_through_sync(
                _address(scenario, proxy),
                scenario.jobs,
                threads=scenario.tasks,
                load=load,
                **(proxy.tls_options() if scenario.key == TLS_KEY else {}),
            )
        )
    print(f"  deduplicated acks (a keyed call processed twice): {len(load.deduplicated)}")
    return load.failure_kinds()


async def run_trio_client(scenario: Scenario, proxy: Any) -> Counter[str]:
    """sepp-trio's own async client, tasks for threads: compare_seppy.py's run_ours, with TLS."""
    load = Load()

    options = proxy.tls_options() if scenario.key == TLS_KEY else {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(load.reload_at, proxy, scenario.reload_after)
        await enqueue_through(
            _address(scenario, proxy), scenario.jobs, tasks=scenario.tasks, load=load, **options
        )
    return load.failure_kinds()


async def run_grpcio(scenario: Scenario, proxy: Any) -> Counter[str]:
    command = [seppy_python(), str(GRPCIO_LOAD), _address(scenario, proxy), QUEUE]
    command += [str(scenario.jobs), str(scenario.tasks)]
    if scenario.reload_after:
        marks = ",".join(str(m) for m in scenario.reload_after)
        command.append(f"{proxy.proc.process.pid}:{int(signal.SIGHUP)}:{marks}")
    if scenario.key == TLS_KEY:
        ca_path = proxy.tls.cert_path.parent / "ca.pem"
        ca_path.write_bytes(proxy.tls.ca_pem)
        command += ["--tls", str(ca_path), proxy.tls.server_name]
    # Without our PYTHONPATH: `sepp` there is sepp-py's package, not ours.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = await trio.run_process(command, capture_stdout=True, env=env)
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    print(f"  deduplicated acks (a keyed call processed twice): {result['deduplicated']}")
    return Counter(result["errors"])


async def main(args: argparse.Namespace) -> None:
    clients = {"sepp.SyncClient": run_sync_client, "grpcio (blocking)": run_grpcio}
    if args.with_async:
        clients["sepp.Client (trio)"] = run_trio_client
    await compare(
        args, SYNC_SCENARIOS, clients, prefix="sepp-proxy-compare-sync-", callers="threads"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="scenario keys")
    parser.add_argument(
        "--with-async", action="store_true", help="and sepp-trio's async client (tasks)"
    )
    trio.run(main, parser.parse_args(sys.argv[1:]))
