"""A package's public names, each imported from its module at first use (PEP 562, "Module
__getattr__ and __dir__").

A package's ``__init__`` that imports every module eagerly runs them all whenever any one is
imported: ``import reference_impl.tp.tp_collectives`` would load ``vocab_parallel`` too. In a
student handout a withheld module *is* the student's file (``reference_impl.course.own_files``),
and a student file that imports ``reference_impl.tp.tp_collectives`` while it is itself being
loaded would then meet its own half-loaded module. With lazy names, importing a module loads
that module and what it imports, nothing more, in whatever order packages load.

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {
        "tp_layers": ["ColumnParallelLinear", "RowParallelLinear"],
        ...
    })
"""
from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, names_by_module: dict[str, list[str]]):
    """``package``'s module ``__getattr__``, ``__dir__`` and ``__all__`` for the public names
    ``names_by_module`` (module, relative to the package -> the names it defines)."""
    module_of = {name: module for module, names in names_by_module.items() for name in names}

    def __getattr__(name: str):
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module_of[name]}"), name)
        setattr(sys.modules[package], name, value)  # looked up once
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(module_of))

    return __getattr__, __dir__, list(module_of)
