"""`sepp-trio worker --processes N`: a supervisor running N worker processes of one target.

Each child is the ordinary `worker` command in a process of its own, started with
multiprocessing's spawn method (a fresh interpreter: no state forked from the supervisor, the
same on every platform), so handlers use every core. The supervisor runs on trio whatever
`--loop` the children use. It
- passes SIGINT/SIGTERM on to every child as SIGTERM, so the n-th signal means for each child
  what it means for one worker: graceful, then stop now (jobs returned), then a hard stop;
- replaces a child that exits unexpectedly (SIGKILL, the OOM killer, a crash in a C
  extension) after a backoff, and stops the group on a crash loop rather than spin (when:
  `policy`);
- serves the group's `/healthz`, `/readyz` and `/metrics` (`group_http`), asking each child
  on the ports it reports over its pipe (`child`, `messages`);
- passes SIGUSR1 (pause) and SIGUSR2 (resume) on to every child, and starts a replaced one as
  the group is (paused or not);
- with `--reload` (even for one process), replaces every child when a source file of the
  target changes (`reload`): the old process stops gracefully (it settles every job it
  holds), the new one starts at once; one that exits before reserving (the code does not
  load) waits for the next change rather than a crash loop;
- exits 0 only when the last process of every child exited 0 (it settled every job it held).
"""

from __future__ import annotations

import argparse
import copy
import logging
import multiprocessing
import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path

import trio

from .._failures import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from .._signals import PAUSE_SIGNAL, RESUME_SIGNAL, on_pause_signals, run_until_signalled
from .child import ChildRun, child_main
from .messages import MessageError, Ports, Reserving, TakesSignals, decode
from .policy import CrashLoop, NeverReady, Restart, RestartPolicy, UsageExit
from .reload import POLL_S, changed, drop_cached_bytecode, scan, watched_roots

log = logging.getLogger("sepp.cli")


def describe_exit(exitcode: int | None) -> str:
    """A process's end as a person reads it (multiprocessing: -N for signal N)."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with status {exitcode}"


class Child:
    """One of the N slots: the process running in it now, and what it said."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: multiprocessing.process.BaseProcess | None = None
        self.pid: int | None = None
        self.ports = Ports()  # the child's own, on 127.0.0.1
        self.reserving = False  # it said so since it started
        self.takes_signals = False
        self.started_paused = False  # its command line said --paused
        self.reloading = False  # told to stop for new code: started again at once
        self.signals_owed = 0  # stop signals to pass on once it takes them
        self.restarts = 0
        self.state = "starting"  # what the group's probes say while it is not running
        self.exitcode: int | None = None  # of the last process, once it ended

    @property
    def running(self) -> bool:
        return self.process is not None and self.exitcode is None

    @property
    def label(self) -> str:
        return f"child {self.index} (pid {self.pid})"


class Fleet:
    """The supervisor: `await fleet.run()` until every child has stopped."""

    def __init__(self, args: argparse.Namespace, count: int, child_run: ChildRun) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._child_run = child_run
        self._child_args = child_arguments(args)
        self.args = args
        self.children = [Child(index) for index in range(count)]
        self.signals = 0  # stop signals forwarded so far
        self._stopping = trio.Event()
        self.failure: str | None = None  # why the group stopped by itself
        self.exit_status = EXIT_FAILURE  # then
        self._policy = RestartPolicy()
        self.paused = bool(getattr(args, "paused", False))  # the group's, for new children too
        self._reload = bool(getattr(args, "reload", False))
        self._roots = watched_roots(args.target) if self._reload else []  # UsageError now
        # Set when the group stops, and (with --reload) when the source changes: replaced then.
        self._woken = trio.Event()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        from .group_http import serve_group

        async with trio.open_nursery() as nursery:
            await nursery.start(serve_group, self, self.args)
            await nursery.start(on_pause_signals, self.pause, self.resume)
            if self._reload:
                nursery.start_soon(self._watch, self._roots)
            async with trio.open_nursery() as keepers:
                for child in self.children:
                    keepers.start_soon(self._keep, child)
            nursery.cancel_scope.cancel()  # every child stopped: stop serving

    # -- signals ------------------------------------------------------------------------------

    def forward(self, sig: signal.Signals) -> None:
        """A stop signal: each running child gets a SIGTERM (its n-th, as the group's)."""
        self.signals += 1
        step = ("shutting down gracefully", "stopping now", "stopping at once")[
            min(self.signals, 3) - 1
        ]
        log.info("%s: %s; passing it on to %d worker process(es)", sig.name, step, self._running())
        self._stop()

    def fail(self, reason: str, exit_status: int = EXIT_FAILURE) -> None:
        """Stop the group by itself (a crash loop): the others stop gracefully."""
        if self.failure is None:
            self.failure, self.exit_status = reason, exit_status
            log.error("%s; stopping every worker process", reason)
        if not self.signals:
            self.signals = 1
            self._stop()

    def pause(self, sig: signal.Signals) -> None:
        """SIGUSR1: every child pauses (and a child started later starts paused)."""
        self._pass_pause_on(sig, paused=True)

    def resume(self, sig: signal.Signals) -> None:
        """SIGUSR2: every child resumes."""
        self._pass_pause_on(sig, paused=False)

    def _pass_pause_on(self, sig: signal.Signals, *, paused: bool) -> None:
        self.paused = paused
        ready = [child for child in self.children if child.running and child.takes_signals]
        log.info(
            "%s: %s; passing it on to %d worker process(es)",
            sig.name,
            "pausing" if paused else "resuming",
            len(ready),
        )
        for child in ready:
            self._kill(child, sig)

    def _pause_signal_owed(self, child: Child) -> None:
        """A child that now takes signals, started otherwise than the group is now."""
        if child.started_paused != self.paused:
            sig = PAUSE_SIGNAL if self.paused else RESUME_SIGNAL
            if sig is not None:
                self._kill(child, sig)

    def _stop(self) -> None:
        self._stopping.set()
        self._woken.set()
        for child in self.children:
            if not child.running:
                continue
            if child.takes_signals:
                self._kill(child, signal.SIGTERM)
            else:
                child.signals_owed += 1  # sent once it takes them

    def _running(self) -> int:
        return sum(child.running for child in self.children)

    @staticmethod
    def _kill(child: Child, sig: signal.Signals) -> None:
        if child.running and child.pid is not None:
            try:
                os.kill(child.pid, sig)  # not reaped before exitcode is set: the pid is its
            except ProcessLookupError:
                pass

    # -- reloading ------------------------------------------------------------------------------

    async def _watch(self, roots: list[Path]) -> None:
        """`--reload`: scan the source every `POLL_S` seconds (in a thread: the stat calls
        block); on a change, replace every child."""
        before = await trio.to_thread.run_sync(scan, roots)
        log.info(
            "watching %d .py file(s) under %s for changes",
            len(before),
            ", ".join(map(str, roots)),
        )
        while True:
            await trio.sleep(POLL_S)
            after = await trio.to_thread.run_sync(scan, roots)
            paths = changed(before, after)
            before = after
            if paths and not self._stopping.is_set():
                await trio.to_thread.run_sync(drop_cached_bytecode, paths)
                self._replace_children(paths)

    def _replace_children(self, paths: list[str]) -> None:
        more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
        running = [child for child in self.children if child.running]
        log.info(
            "%s changed%s: replacing %d worker process(es); each settles what it holds first",
            paths[0],
            more,
            len(running),
        )
        for child in running:
            if not child.reloading:
                child.reloading = True
                child.state = "reloading"
                if child.takes_signals:
                    self._kill(child, signal.SIGTERM)  # else once it takes them (_listen)
        woken, self._woken = self._woken, trio.Event()
        woken.set()  # the children waiting for a change (or sitting out a restart delay)

    # -- one slot -------------------------------------------------------------------------------

    async def _keep(self, child: Child) -> None:
        """Run `child`'s slot: start a process, and another after an unexpected exit, as the
        policy says."""
        while not self._stopping.is_set():
            exitcode = await self._run_one(child)
            if self._stopping.is_set():  # (set meanwhile)
                if exitcode != 0:
                    log.error("%s %s", child.label, describe_exit(exitcode))
                return
            how = describe_exit(exitcode)
            if child.reloading:
                child.reloading = False
                log.log(
                    logging.INFO if exitcode == 0 else logging.WARNING,
                    "%s %s; starting it again with the changed source",
                    child.label,
                    how,
                )
                continue
            if self._reload and not child.reserving:
                log.error(
                    "%s %s before reserving (see its log); waiting for a change to the source"
                    " to start it again",
                    child.label,
                    how,
                )
                child.state = f"waiting for a change to the source (pid {child.pid} {how})"
                await self._woken.wait()
                continue
            child.restarts += 1
            decision = self._policy.exited(
                child.index, exitcode, reserved=child.reserving, now=trio.current_time()
            )
            if isinstance(decision, UsageExit):
                self.fail(
                    f"{child.label} {how}: a usage error, which no restart fixes",
                    exit_status=EXIT_USAGE,
                )
                return
            if isinstance(decision, CrashLoop):
                self.fail(
                    f"crash loop: {decision.exits} unexpected exits within"
                    f" {decision.window_s:g}s, the last: {child.label} {how}"
                )
                return
            if isinstance(decision, NeverReady):
                self.fail(
                    f"crash loop: child {child.index} exited before reserving"
                    f" {decision.exits} times in a row, the last: pid {child.pid} {how}"
                )
                return
            assert isinstance(decision, Restart)
            log.log(
                logging.WARNING if exitcode == 0 else logging.ERROR,
                "%s %s unexpectedly; the jobs it held return to the queue when their leases"
                " expire; starting another in %.3gs",
                child.label,
                how,
                decision.delay_s,
            )
            child.state = f"restarting after pid {child.pid} {how}"
            with trio.move_on_after(decision.delay_s):
                await (self._woken if self._reload else self._stopping).wait()

    async def _run_one(self, child: Child) -> int:
        """Start a process in `child`'s slot and return its exit code once it ends."""
        parent_end, child_end = self._context.Pipe()
        child_args = copy.copy(self._child_args)
        child_args.paused = self.paused
        process = self._context.Process(
            target=child_main,
            args=(self._child_run, child_args, child.index, child_end),
            name=f"sepp-worker-{child.index}",
        )
        # Ignored, SIGINT stays ignored across exec: the child starts immune to a Ctrl-C sent
        # to the terminal's process group until it leaves that group (see child_main).
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            process.start()
        finally:
            signal.signal(signal.SIGINT, handler)
            child_end.close()
        child.process, child.pid, child.exitcode = process, process.pid, None
        child.ports, child.reserving, child.takes_signals = Ports(), False, False
        child.signals_owed, child.started_paused = 0, self.paused
        log.info("child %d started: pid %s", child.index, child.pid)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._listen, child, parent_end)
                await trio.lowlevel.wait_readable(process.sentinel)
                nursery.cancel_scope.cancel()
            process.join()
        finally:
            if process.exitcode is None:  # cancelled: a hard stop of the supervisor itself
                process.kill()
                process.join()
            parent_end.close()
            child.exitcode = process.exitcode
        assert process.exitcode is not None
        return process.exitcode

    async def _listen(self, child: Child, conn: Connection) -> None:
        """What the child says over its pipe (see `child.SupervisorLink`)."""
        while True:
            await trio.lowlevel.wait_readable(conn.fileno())
            try:
                message = decode(conn.recv_bytes())
            except (EOFError, OSError):
                return
            except MessageError as exc:
                log.warning("%s sent what is no message: %s", child.label, exc)
                continue
            if isinstance(message, Ports):
                child.ports = message
            elif isinstance(message, TakesSignals):
                child.takes_signals = True
                for _ in range(child.signals_owed):
                    self._kill(child, signal.SIGTERM)
                if child.reloading and not child.signals_owed:
                    self._kill(child, signal.SIGTERM)  # the source changed as it started
                self._pause_signal_owed(child)
            elif isinstance(message, Reserving):
                child.reserving = True
                log.info("%s is worker %s", child.label, message.worker_id)


def child_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """A child's command line: one process, its probes and metrics (if the group serves
    them) on ports of its own on the loopback interface, for the supervisor alone."""
    child = copy.copy(args)
    child.processes = 1
    child.reload = False
    child.health_port = 0 if args.health_port is not None else None
    child.metrics_port = 0 if args.metrics_port is not None else None
    child.http_host = "127.0.0.1"
    return child


async def supervise(args: argparse.Namespace, child_run: ChildRun) -> int:
    """Run `args.processes` children, each `child_run(its args)`, until signalled; returns
    the exit status."""
    fleet = Fleet(args, args.processes, child_run)
    log.info(
        "starting %d worker process%s of %s%s",
        args.processes,
        "" if args.processes == 1 else "es",
        args.target,
        "; replacing each when its source changes (--reload)" if args.reload else "",
    )
    hard_stopped = await run_until_signalled(fleet.run, [fleet.forward] * 3)
    if hard_stopped:
        log.error(
            "stopped at once: every worker process killed, their jobs return when their"
            " leases expire"
        )
        return EXIT_FAILURE
    unsettled = [
        f"{child.label} {describe_exit(child.exitcode)}"
        for child in fleet.children
        if child.exitcode not in (0, None)
    ]
    if fleet.failure is not None:
        log.error("stopped: %s", fleet.failure)
        return fleet.exit_status
    if unsettled:
        log.error(
            "stopped, but not every job was settled: %s (see its log; its jobs return when"
            " their leases expire)",
            "; ".join(unsettled),
        )
        return EXIT_FAILURE
    log.info("all %d worker processes stopped", len(fleet.children))
    return EXIT_OK
