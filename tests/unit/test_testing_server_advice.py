"""`SeppServerNotFound` says what a pip user can do (cargo, SEPP_BIN), and names the
repository's own script only where it exists: in a source checkout, never from a wheel."""

from __future__ import annotations

from pathlib import Path

import pytest

from sepp.testing import INSTALL_COMMAND, SeppServerNotFound, _server, find_sepp_binary


def not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("SEPP_BIN", raising=False)
    monkeypatch.setenv("SEPP_TRIO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SeppServerNotFound) as info:
        find_sepp_binary()
    return str(info.value)


def test_the_advice_is_cargo_and_sepp_bin_and_the_script_only_in_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_checkout = not_found(tmp_path, monkeypatch)  # these tests run from the repository
    root = tmp_path / "cache" / "sepp-0.1.1"
    assert f"{INSTALL_COMMAND} --root {root}" in in_checkout
    assert "SEPP_BIN=/path/to/sepp" in in_checkout
    script = Path(__file__).resolve().parents[2] / "scripts" / "ensure-sepp-server.sh"
    assert f"in this checkout, run {script}" in in_checkout

    monkeypatch.setattr(_server, "_repository_script", lambda: None)  # as from a wheel
    installed = not_found(tmp_path, monkeypatch)
    assert "ensure-sepp-server" not in installed and "scripts/" not in installed
    assert f"{INSTALL_COMMAND} --root {root}" in installed and "SEPP_BIN=" in installed


def test_the_script_is_looked_for_beside_the_source_tree_only(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout" / "src" / "sepp" / "testing" / "_server.py"
    wheel = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "sepp" / "testing"
    script = tmp_path / "checkout" / "scripts" / "ensure-sepp-server.sh"
    script.parent.mkdir(parents=True)
    assert _server._repository_script(str(checkout)) is None  # no script yet
    script.write_text("#!/bin/sh\n")
    assert _server._repository_script(str(checkout)) == script.resolve()
    assert _server._repository_script(str(wheel / "_server.py")) is None
