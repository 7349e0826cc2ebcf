"""Modules imported on first attribute access, so that `import sepp` does not pay for them."""

from __future__ import annotations

import importlib
import types


class _LazyModule(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        module = importlib.import_module(self.__name__)  # thread-safe: the import lock
        # Become a plain module holding the real one's names, so that later lookups cost what
        # any module attribute costs. A thread racing this sees either a name already copied
        # or this method again, which returns the same value.
        self.__dict__.update(module.__dict__)
        self.__class__ = types.ModuleType  # type: ignore[assignment]
        return getattr(module, name)


def lazy_module(name: str) -> types.ModuleType:
    """A stand-in for module `name` that imports it when first used. For modules whose globals
    never change after import (such as protobuf gencode): the stand-in holds a copy of them."""
    return _LazyModule(name)
