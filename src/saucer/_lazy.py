"""A package's public names loaded on first access (PEP 562), so importing one of its modules does not import the rest."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``name`` imported from its module in ``exports``
    (name -> dotted module) on first access and kept in ``namespace`` (the package's globals), so later
    lookups do not come back here; :class:`AttributeError` for a name it does not export."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
