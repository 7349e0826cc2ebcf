"""What a type checker sees: mypy --strict (the project's settings) over code using sepp.

One mypy run covers every check, so the cost is paid once:
- `tests/unit/test_worker.py` builds Workers on the scripted FakeClient without a
  `type: ignore`: the fake satisfies the Worker's client Protocol.
- each file in `tests/typing/` marks the lines mypy must refuse with
  `# type: ignore[code]`; strict mode reports an unused ignore, so a line that stopped being
  an error fails the check as surely as a valid line that became one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The same on every interpreter and dependency version: on the matrix's main part only.
pytestmark = pytest.mark.main_only

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"


def run_mypy(*files: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPYPATH": str(ROOT / "tests")}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", *map(str, files)],
        cwd=ROOT,  # pyproject.toml's [tool.mypy]: strict, Python 3.11
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.needs("mypy")
def test_code_using_sepp_type_checks_as_intended() -> None:
    checks = sorted(TYPING.glob("*.py"))
    assert checks, "no typing checks found"
    result = run_mypy(ROOT / "tests" / "unit" / "test_worker.py", *checks)
    assert result.returncode == 0, result.stdout + result.stderr
