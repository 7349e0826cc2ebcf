"""Finding the ``sepp`` server binary to launch: ``SEPP_BIN``, the cache that
``scripts/ensure-sepp-server.sh`` fills, then ``PATH``."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SEPP_SERVER_VERSION = "0.1.1"
"""The sepp server release this client is tested against."""

INSTALL_COMMAND = f"cargo install sepp --version {SEPP_SERVER_VERSION} --locked"
"""The command that installs the pinned server (add ``--root DIR`` to choose where)."""


class SeppServerNotFound(RuntimeError):
    """No usable ``sepp`` server binary could be found."""


def _cache_root() -> Path:
    configured = os.environ.get("SEPP_TRIO_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "sepp-trio"


def sepp_cache_binary_path() -> Path:
    """Where the pinned server is looked for after ``SEPP_BIN``:
    ``${SEPP_TRIO_CACHE:-~/.cache/sepp-trio}/sepp-<version>/bin/sepp``, where
    ``cargo install sepp --version <version> --locked --root <that bin's parent>`` puts it
    (as sepp-trio's own ``scripts/ensure-sepp-server.sh`` does in a checkout).
    """
    exe = "sepp.exe" if sys.platform == "win32" else "sepp"
    return _cache_root() / f"sepp-{SEPP_SERVER_VERSION}" / "bin" / exe


def _is_executable_file(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _not_found_message(reason: str) -> str:
    """What to do, in steps a pip user can take: cargo, or SEPP_BIN; the repository's script
    only when this package runs from a checkout that has it."""
    root = sepp_cache_binary_path().parent.parent
    steps = [
        f"install it with cargo (Rust's package manager: https://rustup.rs) where it is looked"
        f" for:\n      {INSTALL_COMMAND} --root {root}\n"
        f"    (or plain `{INSTALL_COMMAND}` to put it on PATH)",
        "point SEPP_BIN at a sepp binary you have: SEPP_BIN=/path/to/sepp",
    ]
    script = _repository_script()
    if script is not None:
        steps.append(f"in this checkout, run {script} (it builds the server into {root})")
    return (
        f"{reason}\nThe sepp server {SEPP_SERVER_VERSION} is needed to run these tests."
        " Either:\n" + ", or\n".join(f"  * {step}" for step in steps) + "."
    )


def _repository_script(module: str = __file__) -> Path | None:
    """sepp-trio's own `scripts/ensure-sepp-server.sh`, when this package is imported from a
    source checkout (src/sepp/testing/, an editable install) that has it; a wheel has none."""
    script = Path(module).resolve().parents[3] / "scripts" / "ensure-sepp-server.sh"
    return script if script.is_file() else None


def find_sepp_binary() -> str:
    """Return the path of the ``sepp`` server binary to launch.

    Looked up in this order:

    1. the ``SEPP_BIN`` environment variable (it must name an executable file;
       a wrong value is an error, not silently skipped);
    2. the cache, :func:`sepp_cache_binary_path`:
       ``${SEPP_TRIO_CACHE:-~/.cache/sepp-trio}/sepp-0.1.1/bin/sepp``;
    3. ``sepp`` on ``PATH``.

    Raises :class:`SeppServerNotFound` (with the install command and ``SEPP_BIN`` in the
    message) if none of these yields a binary.
    """
    configured = os.environ.get("SEPP_BIN")
    if configured:
        if _is_executable_file(configured):
            return configured
        raise SeppServerNotFound(
            _not_found_message(f"SEPP_BIN={configured!r} is not an executable file.")
        )
    cached = sepp_cache_binary_path()
    if _is_executable_file(cached):
        return str(cached)
    on_path = shutil.which("sepp")
    if on_path:
        return on_path
    raise SeppServerNotFound(
        _not_found_message(
            f"No sepp server binary: SEPP_BIN is not set, {cached} does not exist "
            "and there is no `sepp` on PATH."
        )
    )


def resolve_binary(binary: str | os.PathLike[str]) -> str:
    """The binary a caller named: a path, or a name looked up on ``PATH``."""
    text = os.fspath(binary)
    if os.sep not in text and (os.altsep is None or os.altsep not in text):
        found = shutil.which(text)
        if found is None:
            raise SeppServerNotFound(_not_found_message(f"{text!r} was not found on PATH."))
        return found
    if not os.path.exists(text):
        raise SeppServerNotFound(_not_found_message(f"The sepp binary {text!r} does not exist."))
    if not _is_executable_file(text):
        raise SeppServerNotFound(
            _not_found_message(f"The sepp binary {text!r} is not an executable file.")
        )
    return text
