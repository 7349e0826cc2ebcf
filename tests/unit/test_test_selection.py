"""Which tests run where is declared, not guessed: the test modules carry markers (registered in
pyproject.toml, collected with `--strict-markers`) that tests/conftest.py selects by. These tests
check the declarations against the files on disk, so a rename cannot silently drop a suite."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
CONFTEST = TESTS / "conftest.py"


def registered_markers() -> set[str]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        config = tomllib.load(file)["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in config["addopts"].split()
    return {re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in config["markers"]}


def markers_selected_by_the_conftest() -> set[str]:
    """The marker names tests/conftest.py asks items about (`get_closest_marker("x")`, or a
    name bound to it, called with a string)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(CONFTEST.read_text())):
        if (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and ast.unparse(node.func).split(".")[-1] in ("get_closest_marker", "marked")
        ):
            names.add(node.args[0].value)
    for node in ast.walk(ast.parse(CONFTEST.read_text())):
        # `for marker in ("real_server", "fixture", "unit"): item.get_closest_marker(marker)`
        if isinstance(node, ast.For) and "get_closest_marker" in ast.unparse(node):
            if isinstance(node.iter, ast.Tuple):
                names |= {e.value for e in node.iter.elts if isinstance(e, ast.Constant)}
    return names


def marks_used_by_test_modules() -> dict[str, set[str]]:
    """Each `pytest.mark.NAME` the test modules use (NAME: the files using it)."""
    used: dict[str, set[str]] = {}
    for path in TESTS.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "mark"
                and ast.unparse(node.value) == "pytest.mark"
            ):
                used.setdefault(node.attr, set()).add(str(path.relative_to(TESTS)))
    return used


def test_the_conftest_selects_by_registered_markers_that_modules_declare() -> None:
    selected = markers_selected_by_the_conftest()
    assert {"both_engines", "asyncio_too", "both_codecs", "trio_only", "fixture"} <= selected
    assert selected - registered_markers() == set()
    used = marks_used_by_test_modules()
    # `unit` is the default kind, `trio_only` an opt-out: neither has to be used.
    unused = {name for name in selected - {"unit", "trio_only"} if name not in used}
    assert unused == set(), (
        f"markers the conftest selects by that no test module declares: {unused}"
    )


def test_the_conftest_names_no_test_file() -> None:
    # Selection by file name is what a rename breaks silently: the modules declare it instead.
    names = [
        node.value
        for node in ast.walk(ast.parse(CONFTEST.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if re.search(r"(^|/)test_\w+\.py$", node.value)
    ]
    assert names == [], names


def test_the_directories_the_conftest_names_exist() -> None:
    tree = ast.parse(CONFTEST.read_text())
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_CATEGORY_BY_DIR" for t in node.targets)
    )
    assert isinstance(table, ast.Dict)
    directories = [key.value for key in table.keys if isinstance(key, ast.Constant)]
    assert "integration" in directories
    missing = [d for d in directories if not any((TESTS / d).glob("test_*.py"))]
    assert missing == [], f"tests/conftest.py's _CATEGORY_BY_DIR names no test files in {missing}"


def test_every_test_path_the_project_names_exists() -> None:
    # The docs, scripts and tests name test files by their paths under tests/: a rename must
    # update them, or this fails.
    sources = [
        ROOT / "Makefile",
        ROOT / "pyproject.toml",
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "scripts").glob("*"),
        *TESTS.rglob("*.py"),
        *TESTS.rglob("*.md"),
    ]
    named = {
        (source.relative_to(ROOT), path)
        for source in sources
        if source.is_file()
        for path in re.findall(r"\btests/[\w/]+\.py\b", source.read_text(errors="replace"))
    }
    assert len(named) > 10  # the scan sees them
    missing = sorted((str(s), p) for s, p in named if not (ROOT / p).is_file())
    assert missing == [], f"files named but not on disk: {missing}"


def test_the_main_only_suites_are_the_ones_that_declare_it() -> None:
    # The suites whose outcome depends on neither the interpreter nor the dependencies'
    # versions (SEPP_TEST_SELECTION=off_main, every matrix part but main, leaves them out).
    assert marks_used_by_test_modules()["main_only"] == {
        "packaging/test_distribution.py",
        "packaging/test_matrix_script.py",
        "docs/test_doc_examples.py",
        "docs/test_reference.py",
        "unit/test_module_structure.py",
        "unit/test_typing.py",
        "integration/test_cli_limits_real.py",
        "integration/test_limits_processes_real.py",
    }


def test_the_smoke_selection_covers_what_the_emulated_machines_must_prove() -> None:
    # The codec and the wire (byte order, HPACK, framing, varints, gzip), the client against
    # the real server (TLS too), the Worker, the blocking client and the CLI's round trip,
    # and the check that the part runs on the machine it names.
    smoke = marks_used_by_test_modules()["arch_smoke"]
    assert {
        "unit/test_architecture.py",
        "unit/test_byte_order.py",
        "unit/test_wire_codec.py",
        "unit/test_wire_hpack.py",
        "unit/test_wire_framing.py",
        "unit/test_wire_connection.py",
        "unit/test_message_codec.py",
        "integration/test_client_real.py",
        "integration/test_security_real.py",
        "integration/test_worker_real.py",
        "integration/test_sync_client_real.py",
        "integration/test_cli_real.py",
    } <= smoke
    assert smoke.isdisjoint(marks_used_by_test_modules()["main_only"])
