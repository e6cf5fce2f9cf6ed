"""Names a package loads on first use (PEP 562), so importing the package stays cheap."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_names(package: str, table: Mapping[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package``: ``table[name]`` names the submodule that defines
    ``name``, imported when the name is first used; the value is then a plain attribute."""

    def __getattr__(name: str):
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
