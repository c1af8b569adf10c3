"""Lazy package exports: a subpackage names its public API up front but imports a submodule only when one
of its names is first used. An Ansible module that needs the ledger then does not pay for aiohttp, rich
and the HTTP client (0.35 s of every module run on a fleet host), and merge runs without numpy."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: `names` maps each public name to the private submodule holding it,
    as `"_module"` or, for a name the submodule calls otherwise, `"_module:its_name"`."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = names[name].partition(":")
        return getattr(importlib.import_module(f"{package}.{module}"), attr or name)

    return __getattr__
