"""The supervisor's restart decisions (`_cli/fleet/policy.py`), on made-up exit times: the
delay doubles with each failure in a row and starts again after a child that reserved, a
crash loop across the group and a child that never reserves stop the group, and so does a
usage error at once."""

from __future__ import annotations

from sepp._cli._failures import EXIT_USAGE
from sepp._cli.fleet.policy import (
    CRASH_LIMIT,
    CRASH_WINDOW_S,
    MAX_RESTART_DELAY_S,
    UNREADY_LIMIT,
    CrashLoop,
    NeverReady,
    Restart,
    RestartPolicy,
    UsageExit,
    restart_delay,
)

KILLED = -9


def test_the_delay_doubles_from_half_a_second_up_to_thirty() -> None:
    assert [restart_delay(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert restart_delay(40) == MAX_RESTART_DELAY_S


def test_a_child_that_reserved_before_each_exit_restarts_after_half_a_second_each_time() -> None:
    policy = RestartPolicy()
    # A minute apart: never a crash loop.
    decisions = [
        policy.exited(0, KILLED, reserved=True, now=t * (CRASH_WINDOW_S + 1)) for t in range(20)
    ]
    assert decisions == [Restart(0.5)] * 20


def test_failures_in_a_row_back_off_and_a_reserving_run_starts_again() -> None:
    policy = RestartPolicy()
    assert policy.exited(0, 1, reserved=False, now=0.0) == Restart(0.5)
    assert policy.exited(0, 1, reserved=False, now=100.0) == Restart(1.0)
    assert policy.exited(0, 0, reserved=True, now=200.0) == Restart(0.5)  # it had reserved
    assert policy.exited(0, 1, reserved=False, now=300.0) == Restart(1.0)
    # Each slot counts its own.
    assert policy.exited(1, 1, reserved=False, now=400.0) == Restart(0.5)


def test_a_child_that_never_reserves_stops_the_group_after_three_exits_in_a_row() -> None:
    policy = RestartPolicy()
    times = iter(range(0, 10_000, 100))  # far apart: not a crash loop
    for _ in range(UNREADY_LIMIT - 1):
        assert isinstance(policy.exited(2, KILLED, reserved=False, now=next(times)), Restart)
    assert policy.exited(2, KILLED, reserved=False, now=next(times)) == NeverReady(UNREADY_LIMIT)
    # A reserving run in between starts the count again.
    policy = RestartPolicy()
    for reserved in (False, False, True, False, False):
        assert isinstance(policy.exited(2, KILLED, reserved=reserved, now=next(times)), Restart)


def test_five_exits_of_any_children_within_a_minute_are_a_crash_loop() -> None:
    policy = RestartPolicy()
    for slot in range(CRASH_LIMIT - 1):
        assert isinstance(policy.exited(slot, KILLED, reserved=True, now=10.0 + slot), Restart)
    assert policy.exited(0, KILLED, reserved=True, now=40.0) == CrashLoop(
        CRASH_LIMIT, CRASH_WINDOW_S
    )


def test_exits_older_than_the_window_no_longer_count() -> None:
    policy = RestartPolicy()
    for n in range(CRASH_LIMIT - 1):
        policy.exited(n, KILLED, reserved=True, now=float(n))
    # The first exit (at 0.0) is exactly a window old at 60.0: out of it.
    assert isinstance(policy.exited(0, KILLED, reserved=True, now=CRASH_WINDOW_S), Restart)
    assert policy.exited(1, KILLED, reserved=True, now=CRASH_WINDOW_S + 0.5) == CrashLoop(
        CRASH_LIMIT, CRASH_WINDOW_S
    )


def test_a_usage_error_stops_the_group_at_once_and_counts_nothing() -> None:
    policy = RestartPolicy()
    assert policy.exited(0, EXIT_USAGE, reserved=False, now=0.0) == UsageExit()
    assert policy.exited(0, 1, reserved=False, now=1.0) == Restart(0.5)  # the first failure
