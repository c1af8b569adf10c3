"""Lazy package exports: a subpackage names its public API up front but imports a submodule only when one
of its names is first used. An Ansible module that needs the ledger then does not pay for aiohttp, rich
and the HTTP client (0.35 s of every module run on a fleet host), and merge runs without numpy.

A subpackage writes each public name once, in its `__init__`'s `if TYPE_CHECKING:` block of imports
(what type checkers and readers see), and ends with

    __getattr__, __dir__, __all__ = attach(__name__, __file__)

which reads that block (without running it) for where each name lives."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def declared(package: str, init_file: str) -> dict[str, tuple[str, str]]:
    """Each public name of `package` -> (its submodule, the name the submodule gives it), from the
    `from package._module import name [as public]` lines of the `if TYPE_CHECKING:` block in `init_file`."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"), filename=init_file)
    names: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for stmt in node.body:
            if not isinstance(stmt, ast.ImportFrom) or not stmt.module or stmt.level:
                raise ImportError(
                    f"{init_file}:{stmt.lineno}: the TYPE_CHECKING block holds only absolute from-imports"
                )
            if not stmt.module.startswith(package + "."):
                raise ImportError(f"{init_file}:{stmt.lineno}: {stmt.module} is not a submodule of {package}")
            for alias in stmt.names:
                public = alias.asname or alias.name
                if public in names:
                    raise ImportError(f"{init_file}:{stmt.lineno}: {public} is exported twice")
                names[public] = (stmt.module, alias.name)
    return names


def attach(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The `__getattr__`, `__dir__` and `__all__` of `package`, from the names its `__init__` declares."""
    names = declared(package, init_file)

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = names[name]
        return getattr(importlib.import_module(module), attr)

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__, sorted(names)
