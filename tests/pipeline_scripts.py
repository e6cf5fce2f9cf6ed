"""The scripts under pipelines/ as modules, and planted rows, for the tests of their measurements."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from tokdyn.fit.synthetic import plant_sigmoids, plant_two_steps

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


def planted_rows(x, n: int) -> np.ndarray:
    """[2n, len(x)]: ``n`` planted single events, then ``n`` planted two-step rows, on the
    points ``x`` (the same rows for the same ``n`` and ``x``)."""
    one = plant_sigmoids(n, x, rng=np.random.default_rng(3)).Y
    two = plant_two_steps(n, x, rng=np.random.default_rng(4)).Y
    return np.concatenate([one, two])
