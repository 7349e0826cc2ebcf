"""No test asserts an upper bound on wall-clock seconds: CI machines are loaded, and a bound
that holds here fails there. Tests order by events the fixtures expose, run on trio's MockClock,
or count outcomes; a lower bound ("waited at least") is fine.

This module reads every Python file under tests/ with `ast` and finds:
- an `assert` that bounds from above an elapsed time on the real clock: a difference of two
  readings of `time.monotonic()`, `time.perf_counter()`, `time.time()` (or their `_ns` forms),
  or of the CPU clocks `time.process_time()` / `time.thread_time()` (CPU seconds move with a
  loaded machine's caches and frequency too: speed is proven by `make bench`),
  or of `trio.current_time()` / `anyio.current_time()` outside a test on a MockClock (one with an
  `autojump_clock` or `mock_clock` parameter), followed through local names, lists appended to,
  and the module's functions that return one (`elapsed < 1.0`, `0.3 <= elapsed < 2.5`,
  `waits[1] < 5.0`, `elapsed == pytest.approx(2)`);
- `trio.fail_after(N)` / `anyio.fail_after(N)` (or `fail_at`) outside a MockClock test with N
  under HANG_GUARD_S seconds: a deadline that short is an assertion on speed, not a guard
  against a hang.
ALLOWED lists the exceptions, each with its reason.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 10.0  # the suite's guards (GUARD_S) are 10 s or more
REAL_CLOCKS = {
    "monotonic",
    "perf_counter",
    "monotonic_ns",
    "perf_counter_ns",
    "process_time",
    "process_time_ns",
    "thread_time",
    "thread_time_ns",
}
TRIO_CLOCKS = {"current_time"}
MOCK_CLOCK_PARAMETERS = {"autojump_clock", "mock_clock"}

# (file under tests/, function) -> why its bound is not on the wall clock, or must stay.
ALLOWED: dict[tuple[str, str], str] = {
    ("integration/test_client_real.py", "test_enclosing_deadline_bounds_the_call"): (
        "the 0.5 s fail_after is the enclosing deadline under test, not a bound on the test:"
        " the call's own wait is 60 s, and a hang guard tells a late end from an early one"
    ),
}


@dataclass(frozen=True)
class Bound:
    path: str
    line: int
    function: str
    source: str

    def __str__(self) -> str:
        return f"tests/{self.path}:{self.line} in {self.function}: {self.source}"


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


class _Scope:
    """The names that hold clock readings and elapsed times in one test (with its nested
    functions), and whether it runs on a MockClock."""

    def __init__(self, mock_clock: bool, elapsed_functions: set[str]) -> None:
        self.mock_clock = mock_clock
        self.clock_names: set[str] = set()
        self.deadline_names: set[str] = set()  # a reading plus some seconds
        self.elapsed_names: set[str] = set()
        self.remaining_names: set[str] = set()
        self.elapsed_functions = elapsed_functions

    def is_reading(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            called = node.func
            if isinstance(called, ast.Attribute | ast.Name):
                name = _name(called)
                if name in REAL_CLOCKS:
                    return True
                if name == "time" and isinstance(called, ast.Attribute):
                    return _name(called.value) in ("time", "_time")
                if name in TRIO_CLOCKS:
                    return not self.mock_clock
        return False

    def _root(self, node: ast.AST) -> ast.AST:
        while isinstance(node, ast.Subscript | ast.Starred):
            node = node.value
        return node

    def is_clock(self, node: ast.AST) -> bool:
        """Whether `node` contains a reading of the real clock (or a name holding one)."""
        for sub in ast.walk(node):
            if self.is_reading(sub):
                return True
            if isinstance(sub, ast.Name) and sub.id in self.clock_names:
                return True
        return False

    def is_deadline(self, node: ast.AST) -> bool:
        """`start + 0.3` (a reading, or anything, plus a number), or a name that holds one."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.is_clock(node) or any(
                isinstance(side, ast.Constant) for side in (node.left, node.right)
            )
        return isinstance(node, ast.Name) and node.id in self.deadline_names

    def trend(self, node: ast.AST) -> int:
        """How `node` moves as time passes on the real clock: +1 for an elapsed time (a
        difference of readings, later minus earlier, or a name, list or function holding one),
        -1 for the time left before a deadline (`deadline - now`, `5 - elapsed`), 0 for
        neither. Bounding a +1 from above, or a -1 from below, bounds the time elapsed."""
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Sub):
                left, right = node.left, node.right
                if self.is_deadline(left) and not isinstance(right, ast.Constant):
                    return -1  # deadline - now
                if isinstance(right, ast.Constant) or isinstance(left, ast.Constant):
                    return _sign(self.trend(left) - self.trend(right))  # now - 0.01, 5 - took
                if self.is_clock(left) or self.is_clock(right):
                    return 1  # now - start, whatever start is
                return _sign(self.trend(left) - self.trend(right))
            if isinstance(node.op, ast.Add):
                return _sign(self.trend(node.left) + self.trend(node.right))
            if isinstance(node.op, ast.Mult | ast.Div | ast.FloorDiv):
                return _sign(self.trend(node.left) + self.trend(node.right))
            return 0
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.trend(node.operand)
        if isinstance(node, ast.Await):
            return self.trend(node.value)
        root = self._root(node)
        if isinstance(root, ast.Name):
            if root.id in self.elapsed_names:
                return 1
            if root.id in self.remaining_names:
                return -1
        if isinstance(node, ast.Call) and any(  # measure(), or trio.run(measure)
            _name(f) in self.elapsed_functions for f in (node.func, *node.args)
        ):
            return 1
        return 0

    def learn(self, node: ast.AST) -> None:
        """Follow clock readings and elapsed times into the names they are stored in."""
        targets: list[ast.expr] = []
        value: ast.AST | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend", "add", "insert")
            and node.args
        ):
            targets, value = [node.func.value], node.args[-1]
        if value is None:
            return
        names = [n.id for t in targets for n in ast.walk(self._root(t)) if isinstance(n, ast.Name)]
        trend = self.trend(value)
        if trend:
            (self.elapsed_names if trend > 0 else self.remaining_names).update(names)
        elif self.is_deadline(value):
            self.deadline_names.update(names)
            self.clock_names.update(names)
        elif self.is_clock(value):
            self.clock_names.update(names)


def _sign(n: int) -> int:
    return (n > 0) - (n < 0)


def _upper_bounded(compare: ast.Compare, scope: _Scope) -> bool:
    """Whether `compare` bounds an elapsed time from above (`elapsed < n`, `n > elapsed`,
    `a <= elapsed < b`, `elapsed == pytest.approx(n)`)."""
    operands = [compare.left, *compare.comparators]
    for i, op in enumerate(compare.ops):
        left, right = operands[i], operands[i + 1]
        if isinstance(op, ast.Gt | ast.GtE):
            left, right = right, left  # b > a is a < b
        elif not isinstance(op, ast.Lt | ast.LtE | ast.Eq):
            continue
        if isinstance(op, ast.Eq):
            if any(
                scope.trend(a) and isinstance(b, ast.Call) and _name(b.func) == "approx"
                for a, b in ((left, right), (right, left))
            ):
                return True
        elif scope.trend(left) > 0 or scope.trend(right) < 0:
            return True
    return False


def _constant(node: ast.expr, constants: dict[str, float]) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _module_constants(tree: ast.Module) -> dict[str, float]:
    found: dict[str, float] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                value = _constant(node.value, {})
                if value is not None:
                    found[target.id] = value
    return found


CLOCK_WORDS = (*REAL_CLOCKS, *TRIO_CLOCKS, "time()", "fail_after", "fail_at")


def _reads_a_clock(function: ast.AST, lines: list[str], also: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
    """Whether the function's text names a clock (or one of `also`) at all: most do not, and
    are skipped."""
    text = "\n".join(lines[function.lineno - 1 : function.end_lineno])  # type: ignore[attr-defined]
    return any(word in text for word in (*CLOCK_WORDS, *also))


def _elapsed_functions(tree: ast.Module, lines: list[str]) -> set[str]:
    """The module's functions (at any depth) that return an elapsed time on the real clock."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _reads_a_clock(node, lines):
            scope = _scope_of(node, mock_clock=False, elapsed_functions=set())
            if any(
                isinstance(sub, ast.Return) and sub.value is not None and scope.trend(sub.value) > 0
                for sub in ast.walk(node)
            ):
                names.add(node.name)
    return names


def _scope_of(
    function: ast.FunctionDef | ast.AsyncFunctionDef, mock_clock: bool, elapsed_functions: set[str]
) -> _Scope:
    scope = _Scope(mock_clock, elapsed_functions)
    # Twice: a name may be stored in before the statement that defines what it holds is seen
    # (a nested function's `append` above the assignment it reads).
    for _ in range(2):
        for node in ast.walk(function):
            scope.learn(node)
    return scope


def _on_mock_clock(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    arguments = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    return any(
        a.arg in MOCK_CLOCK_PARAMETERS
        or (a.annotation is not None and "MockClock" in ast.unparse(a.annotation))
        for a in arguments
    )


def _top_level_functions(
    tree: ast.Module,
) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (
                n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            )


def bounds_in(path: Path, source: str | None = None) -> list[Bound]:
    """Every wall-clock upper bound asserted in the file at `path`."""
    text = path.read_text() if source is None else source
    if not any(word in text for word in CLOCK_WORDS):
        return []
    tree = ast.parse(text)
    rel = str(path.relative_to(TESTS)) if path.is_relative_to(TESTS) else path.name
    lines = text.splitlines()
    constants = _module_constants(tree)
    elapsed_functions = _elapsed_functions(tree, lines)
    found: list[Bound] = []
    for function in _top_level_functions(tree):
        if not _reads_a_clock(function, lines, elapsed_functions):
            continue
        mock_clock = _on_mock_clock(function)
        scope = _scope_of(function, mock_clock, elapsed_functions)
        for node in ast.walk(function):
            bounded: ast.AST | None = None
            if isinstance(node, ast.Assert):
                compares = [c for c in ast.walk(node.test) if isinstance(c, ast.Compare)]
                if any(_upper_bounded(c, scope) for c in compares):
                    bounded = node
            elif (
                isinstance(node, ast.Call)
                and _name(node.func) in ("fail_after", "fail_at")
                and not mock_clock
                and node.args
            ):
                seconds = _constant(node.args[0], constants)
                if _name(node.func) == "fail_at" or (
                    seconds is not None and seconds < HANG_GUARD_S
                ):
                    bounded = node
            if bounded is not None:
                line = lines[bounded.lineno - 1].strip()  # type: ignore[attr-defined]
                found.append(Bound(rel, bounded.lineno, function.name, line))  # type: ignore[attr-defined]
    return found


def _allowed(bound: Bound) -> bool:
    return (bound.path, bound.function) in ALLOWED


@functools.cache
def all_bounds() -> list[Bound]:
    return [bound for path in sorted(TESTS.rglob("*.py")) for bound in bounds_in(path)]


def test_no_test_asserts_an_upper_bound_on_wall_clock_seconds() -> None:
    found = [str(b) for b in all_bounds() if not _allowed(b)]
    assert found == [], "upper bounds on wall-clock seconds:\n" + "\n".join(found)


def test_every_allowed_bound_is_still_there() -> None:
    # An exception whose bound went away goes too.
    used = {(b.path, b.function) for b in all_bounds()}
    assert set(ALLOWED) - used == set()


CAUGHT = """
import time, trio, anyio, pytest

async def test_elapsed_name():
    start = time.monotonic()
    await work()
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 2.5

async def test_inline_trio_clock():
    start = trio.current_time()
    await work()
    assert trio.current_time() - start < 1.0

async def test_reading_from_elsewhere():
    (nacked_at,) = spy.nack_sent_at
    came_back = trio.current_time() - nacked_at
    assert 1.9 <= came_back < 4.0

async def test_list_of_waits():
    waits = []
    began = time.perf_counter()
    waits.append(time.perf_counter() - began)
    assert 4.0 < waits[0] < 5.0

async def test_reversed_and_approx():
    t0 = anyio.current_time()
    took = anyio.current_time() - t0
    assert 2 > took
    assert took == pytest.approx(1.0)

async def measure():
    began = time.monotonic()
    await work()
    return time.monotonic() - began

async def test_through_a_helper():
    assert await measure() <= 3

async def test_short_fail_after():
    with trio.fail_after(1):
        await work()

async def test_time_left_bounded_from_below():
    deadline = time.monotonic() + 5
    await work()
    left = deadline - time.monotonic()
    assert left > 4.0

def test_cpu_seconds():
    costs = []
    before = time.process_time()
    start()
    costs.append(time.process_time() - before)
    assert costs[0] < 0.05
"""

FINE = """
import time, trio, pytest
GUARD_S = 10.0

async def test_lower_bounds():
    start = time.monotonic()
    await work()
    assert time.monotonic() - start >= 0.4
    assert 0.5 < time.monotonic() - start

async def test_mock_clock(autojump_clock):
    start = trio.current_time()
    await trio.sleep(5)
    assert trio.current_time() - start == 5
    assert trio.current_time() - start < 6
    with trio.fail_after(1):
        await work()

async def test_hang_guards():
    with trio.fail_after(GUARD_S):
        await work()
    with trio.fail_after(60):
        await work()

async def test_time_left_bounded_from_above():
    start = trio.current_time()
    deadline = start + 0.5
    sent = await work()
    end = trio.current_time()
    assert deadline - end <= sent <= 0.5
    assert 5.0 - (end - start) <= sent < 5.0
    assert start + 0.3 - helper_reading[0] <= sent

def test_counts():
    calls = [1, 2]
    assert len(calls) < 3
"""


def test_the_rule_finds_each_shape_of_bound_and_nothing_else() -> None:
    caught = bounds_in(TESTS / "caught.py", CAUGHT)
    assert [b.function for b in caught] == [
        "test_elapsed_name",
        "test_inline_trio_clock",
        "test_reading_from_elsewhere",
        "test_list_of_waits",
        "test_reversed_and_approx",
        "test_reversed_and_approx",
        "test_through_a_helper",
        "test_short_fail_after",
        "test_time_left_bounded_from_below",
        "test_cpu_seconds",
    ]
    assert bounds_in(TESTS / "fine.py", FINE) == []
