"""The numba fit gives the same bits whether its kernels were compiled in the process or loaded
from numba's on-disk cache.

numba links a copy of each compiled callee into every caller; with value-changing fastmath
flags those copies rounded differently, and which one ran depended on what the process had
compiled itself and what it had loaded from the cache (two-sigmoid fits differed on most
planted rows between a first and a second run). Each fit here runs in a fresh interpreter with
its own cache directory: first cold (everything compiled, then cached), then warm (everything
loaded), then with only the top-level two-sigmoid kernel recompiled against cached callees.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

# A cold compile of every fit kernel takes ~35 s on 2 cores (the whole test ~50 s).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import sys
import numpy as np
from test_store_fit import planted, STEPS
from tokdyn.fit import fit_block
Y, _, _ = planted(400)
x = np.log10(STEPS[1:].astype(float))
np.savez(sys.argv[1], **fit_block(x, Y[:, 1:].astype(np.float64), backend="numba"))
"""


def _fit_in_fresh_process(out: Path, cache: Path) -> dict[str, np.ndarray]:
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                         env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", CHILD, str(out)], env=env, check=True, cwd=ROOT,
                   timeout=600)
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


def _differing(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not np.array_equal(a[k], b[k], equal_nan=True)]


def test_cold_and_cached_kernels_give_identical_fits(tmp_path):
    cache = tmp_path / "numba_cache"
    cold = _fit_in_fresh_process(tmp_path / "cold.npz", cache)
    index = list(cache.rglob("*.nbi"))
    assert index, "the kernels were not cached"
    warm = _fit_in_fresh_process(tmp_path / "warm.npz", cache)
    assert _differing(cold, warm) == []
    # the top-level two-sigmoid kernel compiled afresh, linking callees loaded from the cache
    top = [p for p in cache.rglob("*") if "_varpro_chunks" in p.name]
    assert top
    for p in top:
        p.unlink()
    mixed = _fit_in_fresh_process(tmp_path / "mixed.npz", cache)
    assert _differing(cold, mixed) == []
    assert np.isfinite(cold["sse2"]).mean() > 0.9  # the two-sigmoid fits did run
