"""The scripts under pipelines/ as modules, for the tests of their measurements."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PIPELINES = Path(__file__).resolve().parent.parent / "pipelines"


def load(name: str) -> ModuleType:
    """pipelines/<name>.py, imported under the module name ``name`` (its main() not run).

    The module is registered in ``sys.modules`` as an import would: numba's cache of a script's
    ``cache=True`` function names the module it was compiled in, and loading that cache (every
    run after the first) imports it by that name."""
    path = PIPELINES / f"{name}.py"
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "") != path:
            raise ImportError(f"a module named {name!r} is already imported from elsewhere")
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
