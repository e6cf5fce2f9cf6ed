"""Benchmark: the numba fit's kernels, this checkout against another revision, in one process.

The kernels a fit calls (``prepare_block``, the grid start, the sigmoid and two-sigmoid
solvers, the two-sigmoid start, the standard errors' inverse diagonal) are timed on the very
arguments a fit passed them, this checkout's and REV's alternately, ``--repeat`` times, and
each pair's outputs must be identical (or the line says which differ). One process, so both
sides see the same machine at the same minutes: on a shared machine whose speed drifts by
tens of percent, whole-fit A/Bs in separate processes (``bench_fit.py --against``) cannot
resolve a 10 % change, and these can.

REV's ``lanes.py``, ``numba_kernels.py`` and ``varpro.py`` are loaded from git under other
module names (``_rev_varpro``, ...), their imports of each other rewritten to match: numba
names a compiled function after its module, so the two sides share no compiled code (two
copies of one module name in one process do; docs/benchmarks.md). Their other imports
(``tokdyn.fit.grid``, ``lm``, ``sigmoid``) come from this checkout; a REV whose kernels need
a name this checkout no longer has is refused with that name. REV's kernels are compiled on
the first call (into a temporary cache), which the untimed first round absorbs. This
checkout's come from its own cache: after editing ``lanes.py`` or ``numba_kernels.py``,
delete ``tokdyn/fit/__pycache__`` first (numba keys a kernel's cache on its own file only,
so ``varpro``'s kernels would still hold the old callees).

Output: one JSON line, per data set and kernel the rows it was called on, the median time
per row of each side, the median speed-up (REV's time / this checkout's) with its range, and
whether every round's outputs were identical.

Usage:

    python pipelines/bench_kernels.py --against a2dc665 [--n 20000] [--repeat 5]
        [--data planted,real] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "data" / "tiny_gpt_real.npz"
# the modules loaded from REV, in import order (each may import the ones before it)
MODULES = ("lanes", "numba_kernels", "varpro")
# the kernels timed: (module, function, the argument holding the rows)
KERNELS = (
    ("numba_kernels", "prepare_block", 1),
    ("varpro", "grid_start_block", 1),
    ("varpro", "varpro_block", 2),
    ("varpro", "two_start_block", 1),
    ("numba_kernels", "inverse_diagonal", 0),
)


def git(*args: str) -> subprocess.CompletedProcess:
    """``git -C <this checkout> *args``, its output captured as text."""
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def load_revision(rev: str, into: Path):
    """REV's kernel modules, imported from ``into`` under the names ``_rev_<module>``."""
    for name in MODULES:
        path = f"tokdyn/fit/{name}.py"
        proc = git("show", f"{rev}:{path}")
        if proc.returncode:
            why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "git failed"
            raise SystemExit(f"bench_kernels: cannot read {path} at {rev}: {why}")
        text = proc.stdout
        for other in MODULES:
            text = re.sub(rf"\bfrom tokdyn\.fit\.{other} import\b", f"from _rev_{other} import",
                          text)
            text = re.sub(rf"\bfrom tokdyn\.fit import {other}\b",
                          f"import _rev_{other} as {other}", text)
        (into / f"_rev_{name}.py").write_text(text)
    sys.path.insert(0, str(into))
    try:
        return {name: importlib.import_module(f"_rev_{name}") for name in MODULES}
    except ImportError as e:
        raise SystemExit(f"bench_kernels: {rev}'s kernels do not import against this checkout: {e}")


def record_calls(x, Y) -> dict[str, list]:
    """Fit Y with the current package and keep every kernel call's arguments, by kernel
    (the solver split by model: varpro_block/4 and /7)."""
    from tokdyn.fit import fit_sigmoids, numba_kernels, varpro

    modules = {"numba_kernels": numba_kernels, "varpro": varpro}
    calls: dict[str, list] = {}
    originals = {}

    def recorder(module, name):
        fn = getattr(modules[module], name)
        originals[(module, name)] = fn

        def record(*args, **kwargs):
            key = f"{name}/{args[0]}" if name == "varpro_block" else name
            calls.setdefault(key, []).append((module, name, args, kwargs))
            return fn(*args, **kwargs)

        return record

    for module, name, _ in KERNELS:
        setattr(modules[module], name, recorder(module, name))
    try:
        fit_sigmoids(x, Y, backend="numba")
    finally:
        for (module, name), fn in originals.items():
            setattr(modules[module], name, fn)
    return calls


def _arrays(result):
    import numpy as np

    items = result if isinstance(result, (tuple, list)) else (result,)
    return [np.asarray(v) for v in items]


def same(a, b) -> bool:
    import numpy as np

    return all(len(_arrays(u)) == len(_arrays(v)) and all(
        p.shape == q.shape and np.array_equal(p, q, equal_nan=p.dtype.kind in "fc")
        for p, q in zip(_arrays(u), _arrays(v))) for u, v in zip(a, b))


def compare(calls: list, rev: dict, repeat: int) -> dict:
    """Time one kernel's calls on both sides, alternated; REV's time / ours per round."""
    import numpy as np

    from tokdyn.fit import numba_kernels, varpro

    here = {"numba_kernels": numba_kernels, "varpro": varpro}
    row_arg = {name: i for _, name, i in KERNELS}
    module, name = calls[0][0], calls[0][1]
    rows = sum(int(np.shape(args[row_arg[name]])[0]) for _, _, args, _ in calls)
    sides = {"rev": getattr(rev[module], name, None), "head": getattr(here[module], name)}
    if sides["rev"] is None:
        return {"rows": rows, "skipped": "not in the revision"}

    def run(side):
        fn = sides[side]
        t0 = time.perf_counter()
        out = [fn(*args, **kwargs) for _, _, args, kwargs in calls]
        return time.perf_counter() - t0, out

    try:  # compile, warm
        run("rev")
    except Exception as e:  # another signature, another behaviour: say so, time the rest
        why = (str(e).strip().splitlines() or [""])[0]
        return {"rows": rows, "skipped": f"the revision's fails here: {type(e).__name__}: {why}"}
    run("head")
    per_row = {"rev": [], "head": []}
    ratios, identical = [], True
    for r in range(repeat):
        outs = {}
        for side in (("rev", "head") if r % 2 == 0 else ("head", "rev")):
            seconds, outs[side] = run(side)
            per_row[side].append(seconds / rows * 1e6)
        ratios.append(per_row["rev"][-1] / per_row["head"][-1])
        identical = identical and same(outs["rev"], outs["head"])
    return {
        "rows": rows,
        "rev_us_per_row": round(float(np.median(per_row["rev"])), 3),
        "head_us_per_row": round(float(np.median(per_row["head"])), 3),
        "speedup_median": round(float(np.median(ratios)), 3),
        "speedup_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "identical": identical,
    }


def data_set(name: str, n: int, seed: int):
    import numpy as np

    from tokdyn.fit import log_axis
    from tokdyn.fit.synthetic import plant_sigmoids

    if name == "planted":
        x = log_axis(np.geomspace(10, 1e5, 100))
        return x, plant_sigmoids(n, x, rng=np.random.default_rng(seed)).Y
    if name == "real":
        with np.load(REAL) as d:
            x, Y = d["x"], d["Y"]
        return x, np.tile(Y, (-(-n // len(Y)), 1))[:n]
    raise SystemExit(f"bench_kernels: unknown data set {name!r} (planted, real)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the revision to compare with (git rev)")
    ap.add_argument("--n", type=int, default=20000, help="rows per data set")
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds per kernel")
    ap.add_argument("--data", default="planted,real", help="planted, real or both (comma)")
    ap.add_argument("--threads", type=int, default=1, help="numba threads (both sides)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.n < 1 or args.repeat < 1 or args.threads < 1:
        raise SystemExit("bench_kernels: --n, --repeat and --threads must be positive")
    os.environ["NUMBA_NUM_THREADS"] = str(args.threads)  # before numba is imported
    head = git("rev-parse", "--short", "HEAD").stdout.strip()
    dirty = bool(git("status", "--porcelain", "tokdyn").stdout.strip())
    out = {"bench": "kernels_against", "base": args.against, "head": head,
           "head_uncommitted_changes": dirty, "threads": args.threads, "n": args.n,
           "repeat": args.repeat, "load_avg": [round(os.getloadavg()[0], 2)]}
    with tempfile.TemporaryDirectory() as d:  # REV's modules, and numba's cache of them
        rev = load_revision(args.against, Path(d))
        for name in args.data.split(","):
            x, Y = data_set(name.strip(), args.n, args.seed)
            calls = record_calls(x, Y)
            out[name.strip()] = {key: compare(c, rev, args.repeat)
                                 for key, c in sorted(calls.items())}
    out["load_avg"].append(round(os.getloadavg()[0], 2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
