"""`worker --reload` and the pause signals without a server: the flags, what the supervisor
watches (the target's top-level package, found without importing it), what a scan skips, and
what counts as a change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sepp._cli._failures import UsageError
from sepp._cli._parser import build_parser
from sepp._cli.fleet.reload import changed, drop_cached_bytecode, scan, watched_roots
from sepp._cli.fleet.supervisor import child_arguments


def parse(*extra: str) -> object:
    return build_parser().parse_args(["worker", "app:router", "--queue", "q", *extra])


def test_the_flags_and_what_a_child_is_told() -> None:
    args = parse("--reload", "--paused", "--processes", "2")
    assert (args.reload, args.paused) == (True, True)  # type: ignore[attr-defined]
    child = child_arguments(args)  # type: ignore[arg-type]
    assert (child.processes, child.reload) == (1, False)  # the child is a plain worker
    assert (parse().reload, parse().paused) == (False, False)  # type: ignore[attr-defined]


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "reloadpkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    (package / "sub" / "jobs.py").write_text("")
    (package / "data.txt").write_text("")
    for skipped in ("__pycache__", ".git", "node_modules", "venv"):
        (package / skipped).mkdir()
        (package / skipped / "skipped.py").write_text("")
    (package / "venv" / "pyvenv.cfg").write_text("")
    (tmp_path / "plainmod.py").write_text("")
    (tmp_path / "helper.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    return tmp_path


def test_the_target_s_top_level_package_is_watched_without_importing_it(tree: Path) -> None:
    roots = watched_roots("reloadpkg.sub.jobs:router")
    assert roots == [tree / "reloadpkg"]
    assert "reloadpkg" not in sys.modules
    found = scan(roots)
    assert sorted(Path(p).relative_to(tree).as_posix() for p in found) == [
        "reloadpkg/__init__.py",
        "reloadpkg/sub/jobs.py",
    ]
    # A plain module: its directory (and the packages beside it).
    assert watched_roots("plainmod:router") == [tree]
    assert str(tree / "helper.py") in scan([tree])
    with pytest.raises(UsageError, match="cannot find the module 'nosuchmodule'"):
        watched_roots("nosuchmodule:router")


def test_a_change_is_a_file_added_removed_or_modified(tree: Path) -> None:
    roots = [tree / "reloadpkg"]
    before = scan(roots)
    assert changed(before, scan(roots)) == []
    jobs = tree / "reloadpkg" / "sub" / "jobs.py"
    stamp = os.stat(jobs).st_mtime_ns + 1_000_000_000
    os.utime(jobs, ns=(stamp, stamp))
    (tree / "reloadpkg" / "new.py").write_text("")
    (tree / "reloadpkg" / "__init__.py").unlink()
    after = scan(roots)
    assert [Path(p).name for p in changed(before, after)] == ["__init__.py", "new.py", "jobs.py"]


def test_a_changed_source_s_cached_bytecode_is_dropped_so_a_same_size_edit_runs(
    tmp_path: Path,
) -> None:
    """Python trusts a .pyc whose recorded mtime (in whole seconds) and size match the source:
    "v2" to "v3" within one second would run v2 again after the reload, unless the supervisor
    drops the cache of what changed."""
    module = tmp_path / "edited.py"
    stamp = 1_700_000_000_000_000_000

    def write(text: str) -> None:
        module.write_text(text)
        os.utime(module, ns=(stamp, stamp))  # the same second both times

    def imported() -> str:
        code = "import edited; print(edited.VERSION)"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    write('VERSION = "v2"\n')
    assert imported() == "v2"  # and its .pyc written
    write('VERSION = "v3"\n')
    assert imported() == "v2"  # the trap: the stale .pyc still passes as fresh
    drop_cached_bytecode([str(module)])
    assert imported() == "v3"
    drop_cached_bytecode([str(tmp_path / "never_compiled.py")])  # nothing to drop: no error
