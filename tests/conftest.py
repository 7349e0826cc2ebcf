"""Shared test setup: the real-server fixture, and a summary of what ran where.

Tests are counted by where they run: `unit` (no sockets), `fixture` (our misbehaving h2
server or scripted fakes), `real_server` (the real sepp binary), `memory_server` (the
pure-Python server of sepp.testing), `differential` (both servers, answers compared). The
summary line at the end of a run shows the counts, so a green run that quietly skipped the
server is visible.
"""

from __future__ import annotations

import ast
import functools
import os
import platform
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fixtures.asyncio_front import bridged
from fixtures.fuzz import examples
from fixtures.interpreters import FREE_THREADED, MISSING_TOOLS
from hypothesis import settings

import sepp
from sepp._model import message_codec as message_codec_module
from sepp.testing import ExternalSeppServer, SeppServer
from sepp.wire import WIRE_ENGINES, _engine

pytest_plugins = ["sepp.testing.pytest_plugin"]

# Fuzzing in CI: a bounded number of examples (SEPP_FUZZ_SCALE scales it: fixtures/fuzz.py),
# no per-example deadline on a shared 2-core machine, and the reproduction blob printed on
# failure (pytest also prints the seed).
settings.register_profile(
    "sepp",
    max_examples=examples(int(os.environ.get("SEPP_FUZZ_EXAMPLES", "100"))),
    deadline=None,
    print_blob=True,
)
settings.load_profile("sepp")

# A run started in the background by a non-interactive shell (`make test &`, `nohup`) inherits
# SIGINT ignored, and Python then installs no KeyboardInterrupt handler, neither here nor in
# the processes the tests start (an ignored signal stays ignored across exec): the tests of
# Ctrl-C need the default back. Measured: 5 such tests failed in a `make test` started so.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_TESTS = Path(__file__).parent
_CATEGORY_BY_DIR = {
    "unit": "unit",
    "integration": "real_server",
    "interop": "real_server",
    "hostile": "fixture",
    "chaos": "real_server",
    "proxies": "real_server",
    "memory": "memory_server",
    "differential": "differential",
}
_passed: Counter[str] = Counter()
_KINDS = ("differential", "memory_server", "real_server", "fixture", "unit")
# Which tests run where is declared in the test modules, by markers registered in pyproject.toml
# (`--strict-markers`: a misspelt one fails the collection):
# - `fixture`, `real_server`, `unit` say a test's kind, where its directory does not;
# - `both_engines`: the module runs once per wire engine (our codec and the h2 reference): the
#   sans-IO engine tests, the transport and hostile-server suites, the real-server client tests
#   and the proxy tests;
# - `asyncio_too`: the module (a real-server client or proxy suite) also runs on the asyncio
#   front end, on the default engine; `trio_only("why")` keeps one of its tests on trio;
# - `both_codecs`: the test runs once per message codec (ours and the generated protobuf
#   classes): the hostile-server tests of what response bodies the client is fed;
# - `main_only`: the suite runs on the matrix's main part only (SELECTION below);
# - `arch_smoke`: the test is in the smoke selection of the emulated architectures' parts.
# tests/unit/test_test_selection.py checks the declarations against the files on disk.

# Which tests a run selects, SEPP_TEST_SELECTION (scripts/test_matrix.py sets it per part):
# - "" (the default, the main part): every test;
# - "off_main": all but the `main_only` suites, whose outcome does not depend on the
#   interpreter or the dependencies' versions (the docs' examples, the packaging, the source's
#   layout and typing): the other parts;
# - "arch_smoke": the `arch_smoke` tests only: the codec and the wire, the client, the Worker,
#   the blocking client and the CLI against the real server, on riscv64, s390x and ppc64le
#   under qemu-user, where every Python instruction costs ten times its native one.
# A path named on the command line runs whatever the selection (`make test -- tests/docs`).
SELECTIONS = ("", "off_main", "arch_smoke")
_SELECTION = os.environ.get("SEPP_TEST_SELECTION", "").strip()
if _SELECTION not in SELECTIONS:
    raise pytest.UsageError(
        f"SEPP_TEST_SELECTION={_SELECTION!r}: expected one of {[s for s in SELECTIONS if s]}"
    )


def _engines_to_run() -> tuple[str, ...]:
    """The engines the suites above run on: both, unless SEPP_TEST_WIRE_ENGINES names fewer
    (scripts/test_matrix.py runs the h2 reference's repeats on some parts only)."""
    named = os.environ.get("SEPP_TEST_WIRE_ENGINES", "").strip()
    if not named:
        return WIRE_ENGINES
    engines = tuple(dict.fromkeys(e.strip() for e in named.split(",")))
    if unknown := [e for e in engines if e not in WIRE_ENGINES]:
        raise pytest.UsageError(
            f"SEPP_TEST_WIRE_ENGINES={named!r}: unknown engine(s) {unknown}; expected some of"
            f" {list(WIRE_ENGINES)}, comma-separated"
        )
    return engines


_ENGINES = _engines_to_run()


def _category(item: pytest.Item) -> str:
    for marker in ("differential", "memory_server", "real_server", "fixture", "unit"):
        if item.get_closest_marker(marker) is not None:
            return marker
    rel = Path(str(item.fspath)).resolve().relative_to(_TESTS.resolve())
    return _CATEGORY_BY_DIR.get(rel.parts[0], "unit")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marked = metafunc.definition.get_closest_marker
    if marked("asyncio_too") and "client_front_end" in metafunc.fixturenames:
        combos = [(engine, "trio") for engine in _ENGINES]
        if marked("trio_only") is None:
            combos.append((_engine.DEFAULT_WIRE_ENGINE, "asyncio"))
        metafunc.parametrize(
            ("wire_engine", "client_front_end"),
            combos,
            indirect=["wire_engine"],
            ids=[f"{engine}-{front}" for engine, front in combos],
        )
    elif marked("both_engines"):
        metafunc.parametrize("wire_engine", _ENGINES, indirect=True)
    if marked("both_codecs"):
        metafunc.parametrize("message_codec", message_codec_module.NAMES, indirect=True)


@pytest.fixture
def message_codec(request: pytest.FixtureRequest) -> Iterator[str]:
    """The message codec this test runs on: both, in the tests above; else the selected one
    (SEPP_MESSAGE_CODEC)."""
    before = message_codec_module.NAME
    name = str(getattr(request, "param", before))
    message_codec_module.select(name)
    yield name
    message_codec_module.select(before)


@pytest.fixture(autouse=True)
def _run_on_message_codec(message_codec: str) -> None:
    pass


@pytest.fixture
def wire_engine(request: pytest.FixtureRequest) -> str:
    """The engine this test runs on: both, in the suites above; else the default."""
    return str(getattr(request, "param", _engine.DEFAULT_WIRE_ENGINE))


@pytest.fixture(autouse=True)
def _run_on_wire_engine(wire_engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every sepp.open()/Channel made without wire_engine= uses the package default.
    monkeypatch.setattr(_engine, "DEFAULT_WIRE_ENGINE", wire_engine)


@pytest.fixture
def client_front_end(request: pytest.FixtureRequest) -> str:
    """The front end `sepp.open` opens clients on: trio, or (in the suites above) asyncio."""
    return str(getattr(request, "param", "trio"))


@pytest.fixture(autouse=True)
def _run_on_client_front_end(client_front_end: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if client_front_end == "asyncio":
        monkeypatch.setattr(sepp, "open", bridged(sepp.open, "asyncio"))


_excluded: Counter[str] = Counter()
_selected: list[int] = []  # [tests kept] by SEPP_TEST_SELECTION, when it applied


@functools.cache
def _declares_arch_smoke(path: Path) -> bool:
    """Whether a test module, or one under a directory, marks anything `arch_smoke`."""
    if path.is_dir():
        return any(_declares_arch_smoke(module) for module in path.rglob("test_*.py"))
    return any(
        isinstance(node, ast.Attribute) and node.attr == "arch_smoke"
        for node in ast.walk(ast.parse(path.read_bytes()))
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # The smoke selection does not import the modules that declare no part of it: their
    # imports may need tools the emulated machines' parts lack (pydantic, Django), and
    # importing them costs half a minute there.
    if _SELECTION != "arch_smoke" or config.args_source == pytest.Config.ArgsSource.ARGS:
        return None
    if collection_path.is_dir() or collection_path.name.startswith("test_"):
        return None if _declares_arch_smoke(collection_path) else True
    return None


def _selected_by(item: pytest.Item) -> bool:
    """Whether SEPP_TEST_SELECTION keeps `item`."""
    if _SELECTION == "arch_smoke":
        return item.get_closest_marker("arch_smoke") is not None
    return _SELECTION == "" or item.get_closest_marker("main_only") is None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    # The selection applies to what pytest collects by itself, not to paths the user names.
    select = _SELECTION != "" and config.args_source != pytest.Config.ArgsSource.ARGS
    chosen = 0
    for item in items:
        if item.get_closest_marker(_category(item)) is None:
            item.add_marker(_category(item))
        if select and not _selected_by(item):
            dropped.append(item)
            continue
        chosen += 1
        missing = [
            tool
            for marker in item.iter_markers("needs")
            for tool in marker.args
            if tool in MISSING_TOOLS
        ]
        (dropped if missing else kept).append(item)
        _excluded.update(missing[:1])
    if select:
        _selected[:] = [chosen]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _gil_check(when: str) -> str | None:
    """On a free-threaded build: why the run fails if something turned the GIL back on."""
    if FREE_THREADED and sys._is_gil_enabled():  # type: ignore[attr-defined]
        return f"the GIL is enabled {when} on this free-threaded build"
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    if problem := _gil_check("after importing the test modules"):
        raise pytest.UsageError(problem)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _gil_check("after the tests") and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        _passed[next(m for m in _KINDS if m in report.keywords)] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(
        "sepp-trio tests passed by kind: "
        f"unit={_passed['unit']} fixture={_passed['fixture']} "
        f"real_server={_passed['real_server']} memory_server={_passed['memory_server']} "
        f"differential={_passed['differential']}"
    )
    # scripts/test_matrix.py shows this line in its summary.
    reasons = "; ".join(f"{n} ({MISSING_TOOLS[tool]})" for tool, n in sorted(_excluded.items()))
    terminalreporter.write_line(
        f"sepp-trio tests excluded on this interpreter: {sum(_excluded.values())}"
        + (f": {reasons}" if reasons else "")
    )
    # And this one, when the per-engine suites did not run on every engine.
    if _ENGINES != WIRE_ENGINES:
        terminalreporter.write_line(
            f"sepp-trio per-engine suites ran on: {', '.join(_ENGINES)} only"
            " (SEPP_TEST_WIRE_ENGINES)"
        )
    if _selected:
        terminalreporter.write_line(
            f"sepp-trio selection {_SELECTION}: {_selected[0]} tests (SEPP_TEST_SELECTION)"
        )
    # The matrix checks that an emulated architecture's part ran where it says.
    terminalreporter.write_line(f"sepp-trio machine: {platform.machine()}, {sys.byteorder}-endian")
    if FREE_THREADED:
        problem = _gil_check("after the tests")
        terminalreporter.write_line(problem or "free-threaded build: the GIL stayed disabled")


@pytest.fixture
async def client(sepp_server: SeppServer | ExternalSeppServer) -> AsyncIterator[sepp.Client]:
    async with sepp.open(sepp_server.address) as c:
        yield c
