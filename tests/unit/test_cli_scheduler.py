"""`sepp-trio scheduler` in-process under trio's MockClock, against a scripted server: the open
retried with backoff while the server is not up, and what each signal does. (The subprocess
tests against the real server are in tests/integration/test_cli_real.py.)"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import pairwise

import pytest
import trio
from fixtures.fake_scheduler_server import FakeServer, at
from trio.testing import MockClock

import sepp
from sepp._cli import _connect, _scheduler_command
from sepp._cli._failures import EXIT_OK
from sepp._cli._parser import build_parser

pytestmark = pytest.mark.fixture  # counted with the tests that run against a scripted fake


class Scripted:
    """The command with its connection replaced: the first `refusals` opens fail as an
    unreachable server's do, the later ones yield `server`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, refusals: float) -> None:
        self.server = FakeServer()
        self.server.address = "fake:1"  # type: ignore[attr-defined]
        self.refusals = refusals
        self.opens: list[float] = []
        self.on_close: list[signal.Signals] = []
        schedule = sepp.Schedule().every("tick", 1, "ticks", "tick")
        monkeypatch.setattr(_scheduler_command, "load_schedule", lambda spec: schedule)
        # The worker and scheduler commands connect through one helper in _connect.
        monkeypatch.setattr(_connect, "open_client", self.open_client)

    @asynccontextmanager
    async def open_client(self, args: argparse.Namespace) -> AsyncIterator[FakeServer]:
        self.opens.append(trio.current_time())
        refused = len(self.opens) <= self.refusals
        # Like sepp.open: the connection's tasks live in a nursery around the block, and a
        # refused connection is raised outside it.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            if not refused:
                try:
                    yield self.server
                finally:
                    for sig in self.on_close:  # closing hangs; the operator signals again
                        os.kill(os.getpid(), sig)
                        await trio.sleep_forever()
            nursery.cancel_scope.cancel()
        if refused:
            raise sepp.ConnectError(args.address, "OSError: connection refused")

    async def run(self, *signals: tuple[float, signal.Signals]) -> int:
        """Run `sepp-trio scheduler` with the given signals sent at those trio times."""
        args = build_parser().parse_args(
            ["--address", "fake:1", "scheduler", "app:schedule", "--lookahead", "2"]
        )
        with trio.fail_after(1000):  # trio time: a stop that does not come fails, not hangs
            return await self._run_with_signals(args, signals)

    async def _run_with_signals(
        self, args: argparse.Namespace, signals: tuple[tuple[float, signal.Signals], ...]
    ) -> int:
        async with trio.open_nursery() as nursery:

            async def send(when: float, sig: signal.Signals) -> None:
                await trio.sleep_until(when)
                os.kill(os.getpid(), sig)

            for when, sig in signals:
                nursery.start_soon(send, when, sig)
            return await _scheduler_command.run(args)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "sepp.cli"]


async def test_the_open_is_retried_with_backoff_until_the_server_is_up(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    scripted = Scripted(monkeypatch, refusals=4)
    status = await scripted.run((30.5, signal.SIGTERM))
    assert status == EXIT_OK
    assert trio.current_time() == 30.5  # the signal stopped it at once
    # Backoff: each wait drawn from [0.5, 1.0) of 1, 2, 4, 8 s.
    gaps = [b - a for a, b in pairwise(scripted.opens)]
    assert len(gaps) == 4
    for gap, step in zip(gaps, (1, 2, 4, 8), strict=True):
        assert step / 2 <= gap < step
    logged = messages(caplog)
    refusals = [m for m in logged if m.startswith("server not reachable yet")]
    assert len(refusals) == 4 and "failure 4" in refusals[-1]
    assert "cannot connect to fake:1" in refusals[0]
    # Once connected: the latest past occurrence (missed="latest"), then every one up to the
    # stop plus the 2 s lookahead, each enqueued once.
    up = math.floor(scripted.opens[-1])
    assert scripted.server.occurrences("ticks") == [at(s) for s in range(up, 33)]
    assert len(scripted.server.calls) == 33 - up
    assert "SIGTERM: stopping the scheduler" in logged[-2] and logged[-1] == "scheduler stopped"


async def test_a_signal_while_waiting_for_the_server_stops_at_once(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted = Scripted(monkeypatch, refusals=float("inf"))
    status = await scripted.run((100, signal.SIGINT))
    assert status == EXIT_OK and trio.current_time() == 100
    assert scripted.server.calls == [] and scripted.server.info_calls == []
    # The backoff is capped at 30 s: more than a handful of tries in 100 s.
    assert len(scripted.opens) >= 6


async def test_a_second_signal_cancels_what_the_first_left_running(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    scripted = Scripted(monkeypatch, refusals=0)
    scripted.on_close.append(signal.SIGINT)
    status = await scripted.run((10.5, signal.SIGTERM))
    assert status == EXIT_OK and trio.current_time() == 10.5
    assert any("SIGINT again: stopping at once" in m for m in messages(caplog))
    assert scripted.server.occurrences("ticks")[-1] == at(12)
