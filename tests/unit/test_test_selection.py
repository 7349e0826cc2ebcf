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
