"""Failed calls through the same proxies: sepp-trio against sepp-py (grpcio), measured.

    SEPPY_PYTHON=... PYTHONPATH=src:tests .venv/bin/python tests/proxies/compare_seppy.py
        [--runs 3] [--only nginx-300-tasks]

Not a test: it prints a Markdown table for docs/reliability.md. Every scenario gets a fresh
sepp server and a fresh proxy (from the configs in docs/proxies/) per client and run; both
clients run with their defaults (no retry policy) and send the same jobs (single enqueues,
half of them keyed; see fixtures/proxy_load.py). Reloads are sent at the same call counts
for both. A row shows failed calls per run, then what arrived on the server
(missing / duplicated jobs).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from fixtures.proxies import haproxy_proxy, nginx_proxy
from fixtures.proxy_load import QUEUE, Load, arrival_problems, enqueue_through, jobs_on_server
from peers.seppy import seppy_driver

import sepp
from sepp.testing import sepp_server


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    jobs: int
    tasks: int
    proxy: str = "nginx"
    keepalive_requests: int = 1000
    reload_after: tuple[int, ...] = ()


SCENARIOS = [
    Scenario("nginx-1000", "nginx h2c, keepalive_requests 1000 (default)", 4500, 64),
    Scenario("nginx-100", "nginx h2c, keepalive_requests 100", 4500, 64, keepalive_requests=100),
    Scenario(
        "nginx-reload",
        "nginx h2c, `nginx -s reload` three times",
        3000,
        32,
        reload_after=(500, 1200, 1900),
    ),
    Scenario("nginx-300-tasks", "nginx h2c, 300 tasks (over its 128 streams)", 4500, 300),
    Scenario("haproxy", "HAProxy, `proto h2` on both sides", 4500, 64, proxy="haproxy"),
]


@dataclass
class Outcome:
    failed: int
    missing: int
    twice: int
    errors: Counter[str]


@asynccontextmanager
async def proxy_for(scenario: Scenario, upstream: str, workdir: Path) -> AsyncIterator[Any]:
    if scenario.proxy == "haproxy":
        async with haproxy_proxy(upstream, workdir) as proxy:
            yield proxy
    else:
        async with nginx_proxy(
            upstream, workdir, keepalive_requests=scenario.keepalive_requests
        ) as proxy:
            yield proxy


def _address(proxy: Any) -> str:
    return str(getattr(proxy, "h2c_address", None) or proxy.address)


async def run_ours(scenario: Scenario, proxy: Any) -> Counter[str]:
    load = Load()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(load.reload_at, proxy, scenario.reload_after)
        await enqueue_through(_address(proxy), scenario.jobs, tasks=scenario.tasks, load=load)
    return load.failure_kinds()


async def run_seppy(scenario: Scenario, proxy: Any) -> Counter[str]:
    request: dict[str, Any] = {"queue": QUEUE, "n": scenario.jobs, "concurrency": scenario.tasks}
    if scenario.reload_after:
        pid = proxy.proc.process.pid
        request["signal_at"] = {
            "pid": pid,
            "signum": int(signal.SIGHUP),
            "after": list(scenario.reload_after),
        }
    async with seppy_driver(_address(proxy)) as driver:
        result = await driver.call("enqueue_count", **request)
    return Counter(result["errors"])


async def measure(scenario: Scenario, workdir: Path, run: Callable[..., Any]) -> Outcome:
    config = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}
    async with sepp_server(config) as server:
        async with proxy_for(scenario, server.address, workdir) as proxy:
            errors: Counter[str] = await run(scenario, proxy)
        seen = await jobs_on_server(server.address)
    expected = Load(sent=scenario.jobs).payloads()
    missing, _, twice = arrival_problems(seen, expected)
    return Outcome(sum(errors.values()), missing, twice, errors)


async def compare(
    args: argparse.Namespace,
    scenarios: list[Scenario],
    clients: dict[str, Callable[..., Awaitable[Outcome]]],
    *,
    prefix: str,
    callers: str,
) -> None:
    """Run every scenario (`args.only` of them) `args.runs` times per client, each on a fresh
    server and proxy, and print the table; `callers` names what makes the calls (tasks)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    rows = []
    all_errors: dict[str, Counter[str]] = {name: Counter() for name in clients}
    for scenario in scenarios:
        if args.only and scenario.key not in args.only:
            continue
        cells = []
        for name, run in clients.items():
            outcomes = []
            for i in range(args.runs):
                outcome = await measure(
                    scenario, workdir / f"{scenario.key}-{name.split()[0]}-{i}", run
                )
                outcomes.append(outcome)
                all_errors[name].update(outcome.errors)
                print(f"{scenario.key} {name} run {i + 1}: {outcome}", flush=True)
            failed = ", ".join(str(o.failed) for o in outcomes)
            lost = sum(o.missing for o in outcomes)
            twice = sum(o.twice for o in outcomes)
            cells.append(f"{failed} failed; {lost} missing, {twice} duplicated")
        title = f"{scenario.title}: {scenario.jobs:,} enqueues from {scenario.tasks} {callers}"
        rows.append(f"| {title} | {' | '.join(cells)} |")
    print()
    print(f"| through the proxy ({args.runs} run(s) each) | {' | '.join(clients)} |")
    print("|---|" + "---|" * len(clients))
    print("\n".join(rows))
    print()
    for name, errors in all_errors.items():
        print(f"{name} errors: {dict(errors.most_common(5)) or 'none'}")
    print(f"sepp-trio {sepp.__version__}; work dir {workdir}")


async def main(args: argparse.Namespace) -> None:
    clients = {"sepp-trio": run_ours, "sepp-py (grpcio)": run_seppy}
    await compare(args, SCENARIOS, clients, prefix="sepp-proxy-compare-", callers="tasks")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="scenario keys")
    trio.run(main, parser.parse_args(sys.argv[1:]))
