"""Loading `MODULE:ATTR` targets (a worker's Router, a scheduler's Schedule)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TypeVar

from ._failures import CliError, UsageError

T = TypeVar("T")


def _import(module_name: str) -> object:
    # Like `python -m`: modules in the current directory are importable.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise UsageError(
                f"cannot import {module_name!r}: no module named {exc.name!r} (searched the"
                " current directory and sys.path)"
            ) from exc
        raise CliError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise CliError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc


def load_target(spec: str, kind: type[T], what: str) -> T:
    """The object `spec` (MODULE:ATTR, ATTR may be dotted) names: an instance of `kind`, or a
    zero-argument callable returning one. `what` names `kind` in messages ("a sepp.Router")."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{spec!r}: expected MODULE:ATTR, e.g. myapp.jobs:router")
    target = _import(module_name)
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"{spec}: {module_name!r} has no attribute {attr!r}") from None
    if isinstance(target, kind):
        return target
    if not callable(target):
        raise UsageError(f"{spec} is a {type(target).__name__}, not {what}")
    try:
        made = target()
    except Exception as exc:
        raise CliError(f"calling {spec}() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(made, kind):
        raise UsageError(f"{spec}() returned a {type(made).__name__}, not {what}")
    return made
