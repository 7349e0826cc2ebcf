"""The API reference (docs/reference.md) covers the whole public API, and every public name and
public member has a docstring of its own to generate it from."""

from __future__ import annotations

import enum
import inspect
import re
import sys
import typing
from pathlib import Path

import pytest

import sepp
import sepp.contrib.sentry
import sepp.testing
import sepp.testing.pytest_plugin

# The same on every interpreter and dependency version: on the matrix's main part only.
pytestmark = pytest.mark.main_only

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
from sepp_docs import attribute_doc  # noqa: E402  (docs/_ext is not a package)

REFERENCE = ROOT / "docs" / "reference.md"
ERRORS = ROOT / "docs" / "errors.md"
PUBLIC_MODULES = (sepp, sepp.testing, sepp.testing.pytest_plugin, sepp.contrib.sentry)
_DIRECTIVE = re.compile(r"^\.\. auto(?:class|function|exception|data)::\s+(\S+)\s*$", re.MULTILINE)


def public_names() -> list[str]:
    return [f"{module.__name__}.{name}" for module in PUBLIC_MODULES for name in module.__all__]


def resolve(qualified: str) -> object:
    module_name, _, name = qualified.rpartition(".")
    return getattr(sys.modules[module_name], name)


def own_doc(obj: object) -> str:
    """The docstring written for `obj` itself: not inherited, not a dataclass's generated
    signature, not a fixture wrapper's."""
    if inspect.isclass(obj):
        doc = vars(obj).get("__doc__") or ""
        if doc.startswith(f"{obj.__name__}("):  # @dataclass fills in its signature
            return ""
        return doc.strip()
    wrapped = getattr(obj, "_get_wrapped_function", None)  # a pytest fixture
    if callable(wrapped):
        obj = wrapped()
    return (getattr(obj, "__doc__", None) or "").strip()


def is_constant(obj: object) -> bool:
    return not (inspect.isclass(obj) or inspect.isroutine(obj) or callable(obj))


def documented_in_reference() -> list[str]:
    return _DIRECTIVE.findall(REFERENCE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("qualified", public_names())
def test_every_public_name_has_a_docstring(qualified: str) -> None:
    obj = resolve(qualified)
    if is_constant(obj) or typing.get_origin(obj) is not None:  # a type alias: like data
        module_name, _, name = qualified.rpartition(".")
        doc = attribute_doc(module_name, name)
    else:
        doc = own_doc(obj)
    assert doc, f"{qualified} has no docstring of its own"


def public_members(cls: type) -> list[tuple[str, object]]:
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_") or (isinstance(cls, enum.EnumMeta) and isinstance(value, cls)):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property) or inspect.isfunction(value):
            members.append((name, value))
    return members


@pytest.mark.parametrize("qualified", public_names())
def test_every_public_member_has_a_docstring(qualified: str) -> None:
    obj = resolve(qualified)
    if not inspect.isclass(obj):
        return
    undocumented = [name for name, value in public_members(obj) if not own_doc(value)]
    assert undocumented == [], f"{qualified}: members without a docstring"


def test_the_reference_documents_every_public_name_and_nothing_else() -> None:
    documented = documented_in_reference()
    assert sorted(set(public_names()) - set(documented)) == [], "missing from the reference"
    assert sorted(set(documented) - set(public_names())) == [], "not public, yet in the reference"
    assert len(documented) == len(set(documented)), "documented twice"


def test_the_errors_page_has_a_section_for_every_public_exception() -> None:
    sections = set(re.findall(r"^### `(\w+)`$", ERRORS.read_text(encoding="utf-8"), re.MULTILINE))
    exceptions = {
        qualified.rpartition(".")[2]
        for qualified in public_names()
        if inspect.isclass(resolve(qualified)) and issubclass(resolve(qualified), BaseException)
    }
    assert len(exceptions) > 20
    assert sorted(exceptions - sections) == [], "public exceptions without a section in errors.md"


def test_the_checks_see_a_missing_docstring() -> None:
    class Bare:
        def method(self) -> None:
            pass

    assert own_doc(Bare) == "" and public_members(Bare) == [("method", Bare.method)]
    assert own_doc(sepp.CustomKeyTooLong) != ""  # written, not @dataclass's signature
    assert attribute_doc("sepp", "__version__") == "The version of sepp-trio."
    assert attribute_doc("sepp", "__all__") == ""
