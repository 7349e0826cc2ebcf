"""The one backoff function (`_model/backoff.py`) and `sepp.Backoff` on it: bounds as properties,
and the draws that reproduce the two ways the project drew its jitter before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fixtures.fuzz import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import sepp
from sepp._model import backoff as bo
from sepp._model.backoff import backoff_delay

pytestmark = pytest.mark.unit

durations = st.floats(0.0, 1e6, allow_nan=False)
multipliers = st.floats(1.0, 1e6, allow_nan=False)
failure_counts = st.integers(-5, 10**6)
jitters = st.floats(0.0, 1.0)
draws = st.floats(0.0, 1.0)
# What random.random() returns: a multiple of 2**-53 below 1.
random_results = st.integers(0, 2**53 - 1).map(lambda k: k / 2**53)


def step_of(failures: int, initial: float, multiplier: float, cap: float) -> float:
    return backoff_delay(failures, initial=initial, multiplier=multiplier, cap=cap)


@contextmanager
def drawing(*values: float) -> Iterator[list[float]]:
    """`random.random()` in the backoff module returns `values`; yields what is left."""

    class Scripted:
        def random(self) -> float:
            return left.pop(0)

    left = list(values)
    saved = bo.random
    bo.random = Scripted()  # type: ignore[assignment]
    try:
        yield left
    finally:
        bo.random = saved


@settings(max_examples=examples(300))
@given(failure_counts, durations, multipliers, durations)
def test_the_step_starts_at_initial_grows_and_stops_at_the_cap(
    failures: int, initial: float, multiplier: float, cap: float
) -> None:
    step = step_of(failures, initial, multiplier, cap)
    if failures <= 1:
        assert step == initial  # gRPC's: the first wait is `initial`, even above the cap
    else:
        assert step <= max(initial, cap)
        assert step >= min(initial, cap)
        if failures > 2 or initial <= cap:  # the first wait alone may stand above the cap
            assert step >= step_of(failures - 1, initial, multiplier, cap)  # never shrinks
        else:
            assert step == min(initial * multiplier, cap)
    # A count of any size neither overflows nor grows the step past where the exponent stops.
    last = step_of(10**9, initial, multiplier, cap)
    assert last == step_of(bo.MAX_EXPONENT + 1, initial, multiplier, cap) <= max(initial, cap)
    if multiplier >= 2 and initial >= 1e-6:
        assert last == cap


@settings(max_examples=examples(300))
@given(st.integers(2, 60), st.floats(0.001, 100.0), st.sampled_from([1.0, 2.0, 3.0, 1.6]))
def test_below_the_cap_the_step_is_initial_times_multiplier_per_failure(
    failures: int, initial: float, multiplier: float
) -> None:
    expected = initial * multiplier ** (failures - 1)
    assert step_of(failures, initial, multiplier, expected * 2) == expected
    assert step_of(failures, initial, multiplier, expected / 2) == expected / 2


@settings(max_examples=examples(300))
@given(failure_counts, durations, multipliers, durations, jitters, draws)
def test_jitter_only_shortens_and_by_at_most_its_fraction(
    failures: int, initial: float, multiplier: float, cap: float, jitter: float, draw: float
) -> None:
    step = step_of(failures, initial, multiplier, cap)
    delay = backoff_delay(
        failures, initial=initial, multiplier=multiplier, cap=cap, jitter=jitter, draw=draw
    )
    assert (1.0 - jitter) * step <= delay <= step
    ends = [
        backoff_delay(
            failures, initial=initial, multiplier=multiplier, cap=cap, jitter=jitter, draw=d
        )
        for d in (0.0, 1.0)
    ]
    assert ends == [(1.0 - jitter) * step, step]


@settings(max_examples=examples(200))
@given(st.integers(1, 100), st.floats(0.0, 100.0), jitters.filter(bool), random_results)
def test_without_a_draw_one_is_taken_from_random(
    failures: int, initial: float, jitter: float, result: float
) -> None:
    with drawing(result) as left:
        delay = backoff_delay(failures, initial=initial, multiplier=2.0, cap=30.0, jitter=jitter)
    assert left == []
    assert delay == backoff_delay(
        failures, initial=initial, multiplier=2.0, cap=30.0, jitter=jitter, draw=result
    )
    with drawing(result) as left:  # no jitter, no draw: a seeded generator's sequence is kept
        backoff_delay(failures, initial=initial, multiplier=2.0, cap=30.0)
        sepp.Backoff(jitter=0).delay(failures)
    assert left == [result]


@settings(max_examples=examples(300))
@given(st.integers(1, 100), st.floats(0.0, 100.0), jitters, random_results)
def test_the_draws_reproduce_the_two_old_ways_of_jittering_exactly(
    failures: int, initial: float, jitter: float, r: float
) -> None:
    step = step_of(failures, initial, 2.0, 30.0)
    # The Worker's reserves, the Scheduler, client retries, the command line: the step times
    # random.uniform(0.5, 1.0), which is 0.5 + 0.5 * random.random().
    assert backoff_delay(
        failures, initial=initial, multiplier=2.0, cap=30.0, jitter=0.5, draw=r
    ) == step * (0.5 + 0.5 * r)
    # sepp.Backoff and the relay: the step times 1 - jitter * random.random().
    with drawing(r):
        shortening = bo.shortening_draw()
    assert backoff_delay(
        failures, initial=initial, multiplier=2.0, cap=30.0, jitter=jitter, draw=shortening
    ) == step * (1.0 - jitter * r)


backoffs = st.builds(
    lambda initial, extra, multiplier, jitter: sepp.Backoff(
        initial, multiplier=multiplier, max=initial + extra, jitter=jitter
    ),
    st.floats(0.0, 1e4),
    st.floats(0.0, 1e4),
    st.floats(1.0, 1000.0),
    jitters,
)


@settings(max_examples=examples(300))
@given(backoffs, st.integers(-5, 10**6), random_results)
def test_a_backoffs_delay_is_in_half_open_range_below_its_step(
    backoff: sepp.Backoff, attempt: int, r: float
) -> None:
    exponent = min(max(attempt - 1, 0), 1000)
    try:
        step = min(backoff.initial * backoff.multiplier**exponent, backoff.max)
    except OverflowError:
        step = backoff.max
    with drawing(r):
        delay = backoff.delay(attempt)
    assert delay == step * (1.0 - backoff.jitter * r)
    assert (1.0 - backoff.jitter) * step <= delay <= step
    assert (
        sepp.Backoff(
            backoff.initial, multiplier=backoff.multiplier, max=backoff.max, jitter=0
        ).delay(attempt)
        == step
    )


def test_the_public_backoff_keeps_its_name_and_repr() -> None:
    assert sepp.Backoff.__module__ == "sepp"
    assert repr(sepp.Backoff()) == "sepp.Backoff(1, multiplier=2, max=300, jitter=0.5)"
    assert repr(sepp.Backoff(0.25, multiplier=1.5, max=60, jitter=0)) == (
        "sepp.Backoff(0.25, multiplier=1.5, max=60, jitter=0)"
    )


def test_client_retries_wait_initial_first_even_above_the_cap() -> None:
    policy = sepp.RetryPolicy(max_attempts=5, initial_backoff=10, max_backoff=5, jitter=False)
    assert policy.delays() == [10, 5, 5, 5]
    doubling = sepp.RetryPolicy(max_attempts=6, initial_backoff=0.25, max_backoff=2)
    assert doubling.delays() == [0.25, 0.5, 1, 2, 2]
