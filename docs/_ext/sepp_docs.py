"""Sphinx glue for the sepp-trio docs: the docstrings of re-exported constants.

A constant's docstring is the string literal under its assignment, in the module that assigns
it; `sepp` and `sepp.testing` only import it. autodoc looks for it in the module the directive
names, so for `.. autodata:: sepp.NAME` it finds nothing. `attribute_doc` follows the
`from X import NAME` statements to the assignment and reads its docstring there.
tests/docs/test_reference.py uses it too, to require one.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any


def _source(module_name: str) -> ast.Module | None:
    module = importlib.import_module(module_name)
    path = getattr(module, "__file__", None)
    if path is None or not path.endswith(".py"):
        return None
    return ast.parse(Path(path).read_text(encoding="utf-8"))


def _absolute(module_name: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module_name if _is_package(module_name) else module_name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _is_package(module_name: str) -> bool:
    return hasattr(importlib.import_module(module_name), "__path__")


def attribute_doc(module_name: str, name: str, _depth: int = 0) -> str:
    """The docstring of `module_name.name`, following re-exports; "" if it has none."""
    tree = _source(module_name)
    if tree is None or _depth > 10:
        return ""
    body = tree.body
    for index, node in enumerate(body):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            following = body[index + 1] if index + 1 < len(body) else None
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                return following.value.value
            return ""
    # Re-exports, also those only type checkers see (`sepp/__init__.py` loads some names on
    # first use and imports them under `if TYPE_CHECKING:`).
    imports = [node for node in body if isinstance(node, ast.ImportFrom)]
    imports += [
        inner
        for node in body
        if isinstance(node, ast.If)
        for inner in node.body
        if isinstance(inner, ast.ImportFrom)
    ]
    for node in imports:
        for alias in node.names:
            if (alias.asname or alias.name) == name:
                return attribute_doc(_absolute(module_name, node), alias.name, _depth + 1)
    return ""


# Classes users get from the library, never construct: their signatures would only show
# private plumbing.
NOT_CONSTRUCTED = {"sepp.Client", "sepp.testing.SeppServer"}


def _fill_constant_docs(
    app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    if what != "data":
        return
    module_name, _, attr = name.rpartition(".")
    doc = attribute_doc(module_name, attr)
    # autodoc falls back to the value's type's docstring (int's, str's): never wanted here.
    lines[:] = inspect.cleandoc(doc).splitlines() if doc else []


def _hide_constructor(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: str, annotation: str
) -> tuple[str, str] | None:
    if what == "class" and name in NOT_CONSTRUCTED:
        return "", annotation
    return None


def setup(app: Any) -> dict[str, Any]:
    app.connect("autodoc-process-docstring", _fill_constant_docs)
    app.connect("autodoc-process-signature", _hide_constructor)
    return {"parallel_read_safe": True}
