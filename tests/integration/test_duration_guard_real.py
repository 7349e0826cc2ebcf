"""Durations above the server's advertised maximum: a warning once per call site, naming what
the server will use and that durations are seconds; the call still goes out (the server
clamps it)."""

from __future__ import annotations

import logging

import pytest
import trio

import sepp
from sepp.testing import SeppServer

LEASE_MS = 30_000  # the usual mistake: 30 s in milliseconds


def guard_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "above the server's maximum" in r.getMessage()
    ]


async def test_a_lease_and_a_wait_over_the_maximum_warn_once_per_call_site(
    sepp_server: SeppServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sepp")
    async with sepp.open(sepp_server.address) as client:
        info = await client.get_server_info()  # the limits the guard compares with
        most_lease = info.max_lease_duration.total_seconds()
        for _ in range(3):
            await client.enqueue("guarded", "t")
        for _ in range(3):  # one call site, three calls
            (job,) = (
                await client.reserve(
                    "guarded", lease_duration=LEASE_MS, wait_timeout=20_000, max_jobs=1
                )
                or []
            )
            await client.ack(job.ctx)
        lines = guard_lines(caplog)
        assert len(lines) == 2, lines  # the lease and the wait, each once
        lease_line = next(line for line in lines if "lease_duration" in line)
        assert f"above the server's maximum of {most_lease:g} s" in lease_line
        assert f"the server will use {most_lease:g} s" in lease_line
        assert "Durations are in seconds (30 s if it was meant in milliseconds)" in lease_line
        assert f"{__file__}:" in lease_line  # the call site is the caller's line
        assert any("wait_timeout=20000" in line for line in lines)

        await client.enqueue("guarded", "t")
        (job,) = await client.reserve("guarded", lease_duration=10, wait_timeout=5) or []
        assert len(guard_lines(caplog)) == 2  # within the limits: nothing more
        await client.extend(job.ctx, LEASE_MS)  # another call site: warned about too
        lines = guard_lines(caplog)
        assert len(lines) == 3 and lines[-1].startswith("sepp: extend(lease_duration=30000)")
        await client.ack(job.ctx)


async def test_the_blocking_client_warns_at_its_callers_line(
    sepp_server: SeppServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sepp")

    def blocking_code() -> None:
        with sepp.SyncClient(sepp_server.address) as client:
            client.get_server_info()
            client.enqueue("guarded-sync", "t")
            jobs = client.reserve("guarded-sync", lease_duration=LEASE_MS, wait_timeout=5)
            assert jobs is not None
            client.ack(jobs[0].ctx)

    await trio.to_thread.run_sync(blocking_code)
    (line,) = guard_lines(caplog)
    assert line.startswith("sepp: reserve(lease_duration=30000)")
    assert f"{__file__}:" in line
