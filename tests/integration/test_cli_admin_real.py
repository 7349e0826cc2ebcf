"""`sepp-trio queues` and `sepp-trio dead-letters list`: the server's admin API, read without
consuming anything, against the real sepp server with its admin API switched on."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from test_cli_real import TIMEOUT_S, Done, cli

import sepp
from sepp.testing import SeppServer, sepp_server

ADMIN_KEY = "viewer-secret-0001"


def admin_config(*, keys: bool = False) -> dict[str, object]:
    admin: dict[str, object] = {"enabled": True}
    if keys:
        admin["keys"] = [{"name": "ops", "key": ADMIN_KEY, "role": "viewer"}]
    return {
        "admin": admin,
        "storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 600_000},
    }


@asynccontextmanager
async def admin_server(*, keys: bool = False) -> AsyncIterator[tuple[SeppServer, str]]:
    async with sepp_server(admin_config(keys=keys)) as server:
        line = await server.wait_for_output("admin UI listening at")
        found = re.search(r"admin UI listening at (\S+)", line)
        assert found is not None, line
        yield server, found[1]


async def queues(server: SeppServer, url: str, *args: str, env: Mapping[str, str] = {}) -> Done:
    return await cli(server.address, "queues", "--admin", url, *args, env=env)


async def wait_for_depths(
    server: SeppServer, url: str, want: dict[str, dict[str, int]]
) -> list[dict[str, object]]:
    """`queues --json` until it shows `want` (the server refreshes its counts each second)."""
    with trio.fail_after(TIMEOUT_S):
        while True:
            done = await queues(server, url, "--json")
            assert done.returncode == 0, done
            rows = [json.loads(line) for line in done.stdout_lines]
            shown = {
                str(row["queue"]): {k: row[k] for k in next(iter(want.values()))} for row in rows
            }
            if all(shown.get(name) == counts for name, counts in want.items()):
                return rows
            await trio.sleep(0.2)


async def test_queues_shows_depths_and_dead_letters_and_consumes_nothing() -> None:
    async with admin_server() as (server, url), sepp.open(server.address) as client:
        for n in range(3):
            await client.enqueue("alpha", "a", payload=sepp.Payload.json({"n": n}))
        await client.enqueue("beta", "b")
        await client.enqueue("beta", "b")
        (held,) = await client.reserve("beta", lease_duration=60, wait_timeout=5, max_jobs=1) or []
        (dead,) = await client.reserve("alpha", lease_duration=60, wait_timeout=5, max_jobs=1) or []
        await client.nack(dead.ctx, reason="no such invoice", retry=sepp.Retry.DEAD_LETTER)

        want = {
            "alpha": {"ready": 2, "scheduled": 0, "inflight": 0, "dead_lettered": 1},
            "beta": {"ready": 1, "scheduled": 0, "inflight": 1, "dead_lettered": 0},
        }
        await wait_for_depths(server, url, want)
        shown = await queues(server, url)
        assert shown.returncode == 0, shown
        assert shown.stdout_lines[0].split() == [
            "QUEUE",
            "READY",
            "SCHEDULED",
            "INFLIGHT",
            "DEAD_LETTERED",
        ]
        assert [line.split() for line in shown.stdout_lines[1:]] == [
            ["alpha", "2", "0", "0", "1"],
            ["beta", "1", "0", "1", "0"],
        ]
        only = await queues(server, url, "beta", "--json")
        assert [json.loads(line)["queue"] for line in only.stdout_lines] == ["beta"]

        # Nothing was consumed: the two ready jobs and the dead letter are all still there.
        listed = await cli(
            server.address, "dead-letters", "list", "--queue", "alpha", "--admin", url
        )
        assert listed.returncode == 0, listed
        (record,) = [json.loads(line) for line in listed.stdout_lines]
        assert record["job_id"] == dead.id and record["last_reason"] == "no such invoice"
        assert record["queue"] == "alpha" and record["job_type"] == "a"
        assert record["payload"]["encoding"] == "application/json"
        every = await cli(server.address, "dead-letters", "list", "--admin", url)
        assert [json.loads(line)["job_id"] for line in every.stdout_lines] == [dead.id]
        ready = await client.reserve("alpha", lease_duration=60, wait_timeout=5, max_jobs=10)
        assert len(ready or []) == 2
        drained = await client.drain_dead_letters("alpha", max=10)
        assert [r.job_id for r in drained] == [dead.id]
        await client.ack(held.ctx)


async def test_a_key_comes_from_the_environment_or_a_file_and_refusals_are_one_clear_line(
    tmp_path: Path,
) -> None:
    async with admin_server(keys=True) as (server, url):
        missing = await queues(server, url)
        assert missing.returncode == 1
        assert "needs a key" in missing.stderr and "SEPP_ADMIN_KEY" in missing.stderr
        wrong = await queues(server, url, env={"SEPP_ADMIN_KEY": "not-the-key"})
        assert wrong.returncode == 1 and "refused the key" in wrong.stderr
        assert "not-the-key" not in wrong.stderr
        by_env = await queues(server, url, env={"SEPP_ADMIN_KEY": ADMIN_KEY})
        assert by_env.returncode == 0, by_env
        key_file = tmp_path / "admin.key"
        key_file.write_text(ADMIN_KEY + "\n")
        by_file = await queues(server, url, "--admin-key-file", str(key_file))
        assert by_file.returncode == 0, by_file
        assert by_file.stdout_lines[0].startswith("QUEUE")


async def test_an_admin_api_that_is_off_or_elsewhere_is_a_clear_error() -> None:
    async with sepp_server({"admin": {"enabled": False}}) as server:
        off = await queues(server, "http://127.0.0.1:1")
        assert off.returncode == 1
        assert "cannot reach the admin API at http://127.0.0.1:1" in off.stderr
        assert "[admin]" in off.stderr and "Traceback" not in off.stderr
        bad = await queues(server, "ftp://example")
        assert bad.returncode == 2 and "expected http://host:port" in bad.stderr
