"""`sepp-trio worker --reload`: which source files the supervisor watches, and whether they
changed, by polling their modification times (no watchdog, no inotify: the same on every
platform, and cheap at the sizes a development tree has).

The watched tree is the target's top-level package (`myapp.jobs:router`: every `.py` file under
`myapp/`), found without importing it; a target that is a plain module (`jobs:router`) watches
the `.py` files of its directory and of the directories under it. Hidden directories,
`__pycache__`, `node_modules`, `site-packages` and virtualenvs (a directory holding
`pyvenv.cfg`) are skipped."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from .._failures import UsageError

POLL_S = 0.5  # between two scans: how soon a saved file reloads, in development
SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})

Snapshot = dict[str, tuple[int, int]]  # path -> (mtime_ns, size)


def watched_roots(target: str) -> list[Path]:
    """The directories `--reload` watches for the target `MODULE:ATTR` (UsageError if its
    top-level module cannot be found: from the current directory, as the worker imports it)."""
    module_name = target.partition(":")[0]
    top = module_name.split(".")[0]
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: finding it imports nothing
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise UsageError(f"--reload: cannot find the module {top!r} of {target!r} to watch")
    if spec.submodule_search_locations:
        return [Path(location) for location in spec.submodule_search_locations]
    if spec.origin is None or not os.path.isfile(spec.origin):
        raise UsageError(f"--reload: {top!r} is not a module in a file: nothing to watch")
    return [Path(spec.origin).parent]


def scan(roots: list[Path]) -> Snapshot:
    """Every `.py` file under `roots` (skipping what the module docstring says), with its
    modification time and size."""
    found: Snapshot = {}
    for root in roots:
        for directory, subdirs, files in os.walk(root):
            subdirs[:] = [
                name
                for name in subdirs
                if not name.startswith(".")
                and name not in SKIPPED_DIRS
                and not os.path.exists(os.path.join(directory, name, "pyvenv.cfg"))
            ]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    try:
                        status = os.stat(path)
                    except OSError:  # removed between the listing and the stat
                        continue
                    found[path] = (status.st_mtime_ns, status.st_size)
    return found


def drop_cached_bytecode(paths: list[str]) -> None:
    """Remove the `__pycache__` files of changed sources, so that the next process compiles
    them again. Python trusts a `.pyc` whose recorded mtime (whole seconds) and size match the
    source: an edit that keeps the size within the same second as the one before (`"v2"` to
    `"v3"`) would otherwise run the old code after a reload that said it replaced it."""
    for path in paths:
        for optimization in ("", 1, 2):
            try:
                os.unlink(importlib.util.cache_from_source(path, optimization=optimization))
            except (OSError, ValueError, NotImplementedError):
                pass  # none was written (or this Python keeps no cache)


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """The files added, removed or modified between two scans, sorted."""
    return sorted(
        path for path in before.keys() | after.keys() if before.get(path) != after.get(path)
    )
