"""Every code example in README.md and docs/ runs, in document order, against a real sepp server.

sybil finds the examples (MyST and GitHub markdown both parse with its MyST parsers); this
module says how each kind runs. The rules, also in docs/contributing.md:

- ```python blocks run in one namespace per document, which starts with `address` (the test
  server) and `Path`. A block with a top-level `await` runs in its own `trio.run`, with `client`
  connected to the server. `sepp.open("127.0.0.1:50051")`, the address examples use for a local
  server, reaches the test server. A block whose first line is `# NAME.py` is also written to
  the document's working directory as NAME.py (a module the shell examples import).
- ```console blocks are shell sessions: each `$ command` (continued on `> ` lines) runs with
  bash in that directory, with `$SEPP_ADDR` set, and what it prints (stdout and stderr) must
  match the lines under it once run-specific values (ids, times, ports) are replaced by
  placeholders.
- `<!-- skip: next "why" -->` (or `% skip: next "why"`) marks the next example as
  illustrative; the reason is required. `<!-- invisible-code-block: python -->` runs code the
  reader does not see (setting up what an example needs).
- ```python sepp-py blocks are programs for the official sepp-py client (docs/porting.md's
  "before" examples): each runs as a script in sepp-py's own virtualenv (`SEPPY_PYTHON`,
  built on demand), with `127.0.0.1:50051` replaced by the test server's address, and must
  exit 0. What it prints on stdout must then be what the next example, its sepp-trio twin (a
  python block), prints once run-specific values are replaced (stderr, where logs go, is not
  compared). `python sepp-py alone` runs the same way with nothing compared (a behaviour the
  two clients do not share).
- Other fences are text, not examples, and must say which: text, toml, json, yaml, ini or
  typescript (sepp-js code, which cannot run here: the official JS client is on no registry
  this project reaches).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import difflib
import inspect
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from unittest import SkipTest

import pytest
import trio
from peers.seppy import seppy_python
from sybil import Example, Sybil
from sybil.evaluators.skip import Skipper
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer
from sybil.parsers.myst import CodeBlockParser, SkipParser

import sepp
from sepp.testing import SeppServer
from sepp.testing.pytest_plugin import DEFAULT_TEST_CONFIG

# The same on every interpreter and dependency version: on the matrix's main part only.
pytestmark = pytest.mark.main_only

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The address examples use for a server on this machine; it reaches the test server.
EXAMPLE_ADDRESS = "127.0.0.1:50051"
TEXT_FENCES = {"text", "toml", "json", "yaml", "ini", "typescript"}
BLOCK_TIMEOUT_S = 60
_MODULE_FILE = re.compile(r"# ([\w./-]+\.py)\n")


def evaluate_python(example: Example) -> None:
    source = str(example.parsed)
    named = _MODULE_FILE.match(source)
    if named:
        (Path(example.namespace["cwd"]) / named.group(1)).write_text(source)
    padded = "\n" * (example.line + example.parsed.line_offset) + source
    code = compile(
        padded, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )
    namespace = example.namespace
    twin = namespace.pop(_SEPPY_PRINTED, None)
    if twin is None:
        _run(code, namespace)
        return
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _run(code, namespace)
    print(printed.getvalue(), end="")
    _assert_same_output(twin, printed.getvalue(), "sepp-py printed", "sepp-trio printed")


def _run(code: Any, namespace: dict[str, Any]) -> None:
    if not code.co_flags & inspect.CO_COROUTINE:
        exec(code, namespace)
        return

    async def run_block() -> None:
        with trio.fail_after(BLOCK_TIMEOUT_S):
            async with sepp.open(namespace["address"]) as client:
                namespace["client"] = client
                await eval(code, namespace)

    trio.run(run_block)


# Where a `python sepp-py` block leaves what it printed for its sepp-trio twin to match.
_SEPPY_PRINTED = "_seppy_printed"


def evaluate_seppy(example: Example, *, compare: bool = True) -> None:
    """Run a sepp-py program in sepp-py's venv against the test server."""
    namespace = example.namespace
    source = str(example.parsed).replace(EXAMPLE_ADDRESS, namespace["address"])
    script = Path(namespace["cwd"]) / f"seppy_line_{example.line}.py"
    script.write_text("\n" * (example.line + example.parsed.line_offset) + source)
    env = {k: v for k, v in os.environ.items() if k not in ("SEPP_API_KEY", "PYTHONPATH")}
    done = subprocess.run(
        [seppy_python(), "-I", str(script)],
        cwd=namespace["cwd"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    printed = done.stdout.decode()
    assert done.returncode == 0, (
        f"sepp-py example exited {done.returncode}:\n{printed}{done.stderr.decode()}"
    )
    _assert_no_twin_pending(namespace)
    if compare:
        namespace[_SEPPY_PRINTED] = printed


def _assert_no_twin_pending(namespace: dict[str, Any]) -> None:
    assert _SEPPY_PRINTED not in namespace, (
        "a `python sepp-py` block's twin (a python block) must follow it"
    )


def evaluate_seppy_alone(example: Example) -> None:
    evaluate_seppy(example, compare=False)


def _assert_same_output(expected: str, actual: str, expected_name: str, actual_name: str) -> None:
    if normalise(expected) != normalise(actual):
        diff = difflib.unified_diff(
            normalise(expected), normalise(actual), expected_name, actual_name, lineterm=""
        )
        raise AssertionError("\n".join(diff))


# Values that differ from run to run, replaced in both the expected and the actual output.
_VARYING = [
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<id>"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:\d\d)?"), "<time>"),
    (re.compile(r"\d{8}T\d{6}Z"), "<stamp>"),
    (re.compile(r"127\.0\.0\.1:\d+"), "<address>"),
    (re.compile(r"\b[\w.-]+-\d+-[0-9a-f]{8}\b"), "<worker>"),  # worker ids: host-pid-random
    (re.compile(r"(?<=\bin )\d+(?:\.\d+)?s\b"), "<duration>"),  # "2 passed in 0.81s"
]


def normalise(text: str) -> list[str]:
    for pattern, placeholder in _VARYING:
        text = pattern.sub(placeholder, text)
    return [_canonical_json(line.rstrip()) for line in text.strip("\n").splitlines()]


def _canonical_json(line: str) -> str:
    # A JSON line compares as data: the order of a map's keys is the server's, not ours.
    if not line.startswith("{"):
        return line
    try:
        return json.dumps(json.loads(line), sort_keys=True)
    except ValueError:
        return line


def shell_session(text: str) -> Iterator[tuple[str, str]]:
    """(command, expected output) for each `$ ` line of a console block."""
    command: str | None = None
    output: list[str] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            if command is not None:
                yield command, "\n".join(output)
            command, output = line[2:], []
        elif line.startswith("> ") and command is not None and not output:
            command += "\n" + line[2:]  # a continuation, as a shell's PS2 prompt shows it
        elif command is None:
            raise AssertionError(f"console block output before any `$ ` command: {line!r}")
        else:
            output.append(line)
    if command is not None:
        yield command, "\n".join(output)


def evaluate_console(example: Example) -> str | None:
    _assert_no_twin_pending(example.namespace)
    env = {k: v for k, v in os.environ.items() if k not in ("SEPP_API_KEY", "PYTHONPATH")}
    env["SEPP_ADDR"] = example.namespace["address"]
    env["SEPP_ADMIN_URL"] = example.namespace["admin_url"]
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for command, expected in shell_session(str(example.parsed)):
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=example.namespace["cwd"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=BLOCK_TIMEOUT_S,
            check=False,
        )
        actual = done.stdout.decode()
        if normalise(actual) != normalise(expected):
            diff = "\n".join(
                difflib.unified_diff(
                    normalise(expected), normalise(actual), "documented", "printed", lineterm=""
                )
            )
            return f"$ {command}\n{diff}"
    return None


SYBIL = Sybil(
    parsers=[
        CodeBlockParser("python", evaluate_python),
        CodeBlockParser("console", evaluate_console),
        CodeBlockParser("python sepp-py", evaluate_seppy),
        CodeBlockParser("python sepp-py alone", evaluate_seppy_alone),
        SkipParser(),
    ]
)


def fence_languages(path: Path) -> set[str]:
    document = SYBIL.parse(path)
    lexer = FencedCodeBlockLexer(language=r".*", mapping={"language": "language"})
    return {str(region.lexemes["language"]).split()[0] for region in lexer(document) if True}


@asynccontextmanager
async def redirected_example_address(address: str) -> AsyncIterator[None]:
    """`sepp.open(EXAMPLE_ADDRESS)` and `sepp.SyncClient(EXAMPLE_ADDRESS)` (whose options are
    read by `_checked_options`; with auto-batching it opens through `open_client`) connect to
    `address` while examples run."""
    from sepp._client import sync as _sync

    real_open: Callable[..., Any] = sepp.open
    real_options = _sync._checked_options

    def here(target: str) -> str:
        return address if target == EXAMPLE_ADDRESS else target

    def open_here(target: str, *args: Any, **kwargs: Any) -> Any:
        return real_open(here(target), *args, **kwargs)

    def options_here(target: str, options: Any) -> Any:
        return real_options(here(target), options)

    sepp.open = _sync.open_client = open_here  # type: ignore[assignment]
    _sync._checked_options = options_here
    try:
        yield
    finally:
        sepp.open = _sync.open_client = real_open  # type: ignore[assignment]
        _sync._checked_options = real_options


def evaluate_document(
    path: Path, address: str, cwd: Path, admin_url: str = "http://127.0.0.1:1"
) -> list[str]:
    """Run every example in `path`; returns the reasons of the skipped ones."""
    document = SYBIL.parse(path)
    document.namespace.update(address=address, admin_url=admin_url, cwd=str(cwd), Path=Path)
    skipped: list[str] = []
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        for example in document:
            if isinstance(example.region.evaluator, Skipper) and example.parsed[1] is None:
                raise AssertionError(f"{path.name}:{example.line}: a skip needs a reason")
            try:
                example.evaluate()
            except SkipTest as skip:
                skipped.append(f"{path.name}:{example.line}: {skip}")
    finally:
        os.chdir(previous)
    _assert_no_twin_pending(document.namespace)
    return skipped


def document_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.fixture
def sepp_server_config() -> dict[str, object]:
    # The admin API on too (loopback, an OS-assigned port, no keys), for `sepp-trio queues`
    # and `dead-letters list`: consoles get its URL as $SEPP_ADMIN_URL.
    return {**copy.deepcopy(DEFAULT_TEST_CONFIG), "admin": {"enabled": True}}


@pytest.mark.real_server
@pytest.mark.parametrize("path", DOCUMENTS, ids=document_id)
async def test_every_example_runs(path: Path, sepp_server: SeppServer, tmp_path: Path) -> None:
    line = await sepp_server.wait_for_output("admin UI listening at")
    admin_url = line.split("admin UI listening at ", 1)[1].split()[0]
    async with redirected_example_address(sepp_server.address):
        await trio.to_thread.run_sync(
            evaluate_document, path, sepp_server.address, tmp_path, admin_url
        )


@pytest.mark.parametrize("path", DOCUMENTS, ids=document_id)
def test_every_fence_is_an_example_or_says_it_is_text(path: Path) -> None:
    languages = {lang for lang in fence_languages(path) if not lang.startswith("{")}
    assert languages <= {"python", "console", *TEXT_FENCES}, textwrap.fill(
        f"{path.name}: fences must be python or console (examples) or one of {TEXT_FENCES}"
    )
