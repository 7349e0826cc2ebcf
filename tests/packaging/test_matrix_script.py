"""scripts/test_matrix.py: what `make test` runs on, taken from pyproject.toml, and no skipping."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import test_matrix  # noqa: E402


def test_every_dependency_and_extra_has_its_floor_pinned() -> None:
    pins = test_matrix.floor_pins()
    assert pins["h2"] == "==4.1" and pins["protobuf"] == "==6.30.2" and pins["trio"] == "==0.25"
    assert pins["cronsim"] == "==2.7"
    # The sdk at the api's floor (users pair them), hpack at what h2's floor accepts.
    assert pins["opentelemetry-api"] == pins["opentelemetry-sdk"] == "==1.20"
    assert pins["hpack"] == "==4.0.0"
    assert pins["exceptiongroup"] == '==1.0; python_version < "3.11"'


def test_the_floors_run_on_the_oldest_and_the_newest_claimed_python() -> None:
    versions = test_matrix.claimed_versions()
    parts = {part.name: part for part in test_matrix.plan()}
    assert {name for name in parts if name.startswith("floors-")} == {
        f"floors-py{versions[0]}",
        f"floors-py{versions[-1]}",
    }
    # Every claimed version runs: the main venv's, and each other one as its own part.
    assert {p.version for p in parts.values() if p.version} | {test_matrix.main_version()} == set(
        versions
    )


def test_a_claimed_python_that_is_not_installed_fails_loudly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    with pytest.raises(LookupError, match=r"Python 3\.10 is claimed .* no interpreter was found"):
        test_matrix.find_python("3.10")


def test_an_interpreter_of_another_version_is_not_taken_for_the_claimed_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    impostor = tmp_path / "python3.99"
    impostor.symlink_to(sys.executable)  # python3.99 on PATH, but it is this Python
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    with pytest.raises(LookupError):
        test_matrix.find_python("3.99")
