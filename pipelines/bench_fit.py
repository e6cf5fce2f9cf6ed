"""Benchmark: tokdyn's batched sigmoid fit against scipy.optimize.curve_fit one token at a time.

Plants one learning event per trajectory (100 log-spaced points, Gaussian noise 0.2 nats),
fits all of them with tokdyn and the first ``--n-scipy`` with curve_fit as a researcher would
write it (data-driven start values, default Levenberg-Marquardt), and prints one JSON line:

    fits_per_s         tokdyn, one sigmoid per trajectory with SEs, R^2, status (two_step off);
                       this, full_fits_per_s and scipy's rate are the fastest of --repeat runs
    full_fits_per_s    tokdyn's whole record: sigmoid, constant, line, two sigmoids, BIC, class
    lost_row_fits_per_s  the sigmoid on the same trajectories with one checkpoint missing from
                       every one (a lost row of a store: rows with a missing point take the
                       per-row paths); lost_row_slowdown = fits_per_s / this
    scipy_fits_per_s   curve_fit loop
    speedup            fits_per_s / scipy_fits_per_s; full_speedup the same for the record
    agree_frac         share of scipy-converged trajectories where tokdyn's SSE <= scipy's
                       SSE * (1 + 1e-6)
    scipy_below_floor  of the scipy-converged, how many curve_fit left with a level below 0
                       (tokdyn bounds its levels at 0: for them the reference is scipy solving
                       again with that bound, bounded_reference)
    mu_mae_*           median |mu - planted mu| (decades), tokdyn on all and on scipy's subset
    outside_kernels_frac  numba: the share of a fit's wall time spent outside its compiled
                       kernels (numpy, Python), for the sigmoid and the full record; on 2 threads
                       the second core waits through it
    steps_*            mean solver steps per trajectory (trial steps, restarts included) of the
                       sigmoid and of the full record's two sigmoids: what the speed is made of,
                       whatever the machine's speed (real_steps_*: the same on --real)
    real_*             on real recorded trajectories (--real, default the tiny GPT's probe
                       tokens in tests/data): the share of sigmoid fits with status converged
                       whose SSE is within 0.1 % of the best of many starts (the file's
                       ref_sse, or computed here with scipy for --real-n rows)
    load_avg           the machine's 1-minute load average before and after (2 cores shared
                       with other work inflate every timing; ratios are taken in one run)

Usage: python pipelines/bench_fit.py [--n 200000] [--n-scipy 2000] [--backend auto] [--real F]

Against another revision (``--against REV``): this checkout's fit and REV's (a temporary git
worktree) are timed in separate processes, alternately, ``--pairs`` times, on the same planted
rows; one JSON line with each pair's fits/s, the medians of the per-pair speed-ups, and whether
the two fit identically (a digest of every fit field). Separate processes, because two versions
loaded side by side in one process do not run as they do alone (numba binds same-named
compiled functions across them; docs/benchmarks.md), and alternated pairs, because the
machine's speed drifts by tens of percent within minutes. To resolve changes of a few per
cent, time the kernels themselves in one process: ``pipelines/bench_kernels.py --against
REV`` loads REV's under other module names.

    python pipelines/bench_fit.py --against c692b37 --pairs 6 --n 100000

With ``--store-tokens`` as well, the store is written once and `tokdyn fit --refit` (the full
record, the CLI as a user runs it) of each tree is timed in alternated child processes, after
one untimed fit each that compiles its kernels: what a change to the store job costs (reading,
the scheduler, writing), which the in-memory fits above do not see.

    python pipelines/bench_fit.py --store-tokens 300000 --store-rows 200 --against 0a03ccd~1 --pairs 3

The first fit's compile (``--compile``): numba compiles the kernels on the first fit after
tokdyn is installed or upgraded and caches them on disk. A child process fits 256 planted rows
(the sigmoid alone, then the full record) with an empty cache (``NUMBA_CACHE_DIR`` a fresh
folder), and a second child the same rows from the cache the first left; one JSON line with
both times. With ``--against REV`` the same for REV's tree, alternated ``--pairs`` times.

    python pipelines/bench_fit.py --compile [--against ed14cea --pairs 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
from scipy.optimize import curve_fit

import tokdyn
from tokdyn.fit import available_backends, fit_sigmoids, log_axis
from tokdyn.fit.backends import resolve_backend
from tokdyn.fit.synthetic import plant_sigmoids


def researcher_model(x, l0, linf, mu, s):
    return linf + (l0 - linf) / (1.0 + np.exp((x - mu) / s))


def scipy_loop(x: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """curve_fit per row, start values from the data; (params [n, 4], sse [n], seconds).

    Rows where curve_fit raises (no convergence) get NaN.
    """
    params = np.full((len(Y), 4), np.nan)
    sse = np.full(len(Y), np.nan)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exp overflow, covariance warnings
        for i, y in enumerate(Y):
            l0, linf = y[:5].mean(), y[-5:].mean()
            mu0 = x[np.argmin(np.abs(y - 0.5 * (l0 + linf)))]
            p0 = [l0, linf, mu0, (x[-1] - x[0]) / 10]
            try:
                p, _ = curve_fit(researcher_model, x, y, p0=p0)
            except RuntimeError:
                continue
            params[i] = p
            sse[i] = np.sum((researcher_model(x, *p) - y) ** 2)
    return params, sse, time.perf_counter() - start


def bounded_reference(x, Y, p_sc, sse_sc):
    """scipy's optimum under tokdyn's level bound: where curve_fit's (unbounded) levels are
    below LEVEL_FLOOR, that answer is outside the problem tokdyn solves, so the row is solved
    again by scipy with the floor as a bound (trust-region reflective, from curve_fit's answer
    clipped). Returns (rows below the floor [n], reference SSE [n])."""
    from tokdyn.fit.sigmoid import LEVEL_FLOOR

    below = np.isfinite(sse_sc) & (np.fmin(p_sc[:, 0], p_sc[:, 1]) < LEVEL_FLOOR)
    ref = sse_sc.copy()
    lb = [LEVEL_FLOOR, LEVEL_FLOOR, -np.inf, 1e-6]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in np.flatnonzero(below):
            p0 = np.clip(p_sc[i], lb, np.inf)
            try:
                p, _ = curve_fit(researcher_model, x, Y[i], p0=p0, bounds=(lb, np.inf))
            except RuntimeError:
                ref[i] = np.nan
                continue
            ref[i] = np.sum((researcher_model(x, *p) - Y[i]) ** 2)
    return below, ref


def real_figures(path: str | None, n_ref: int, backend: str, device) -> dict:
    """Share of converged sigmoid fits at the multi-start optimum on real trajectories."""
    if not path:
        return {}
    from tokdyn.fit import FitOptions
    from tokdyn.fit.prepare import prepare
    from tokdyn.fit.reference import multistart_sigmoid

    d = np.load(path)
    x, Y = d["x"], d["Y"].astype(np.float64)
    if "ref_sse" in d:
        ref, source = d["ref_sse"], "file"
    else:
        Y = Y[:n_ref]
        prep = prepare(x, Y, FitOptions())
        ref = multistart_sigmoid(x, Y, prep["lo"], prep["hi"], researcher_starts=(7, 3))
        source = "computed"
    fit = fit_sigmoids(x, Y, backend=backend, device=device)
    best = np.minimum(ref, fit.sse)
    conv = fit.status == 0
    at_opt = fit.sse <= best * (1 + 1e-3)
    return {
        "real_n": int(len(Y)),
        "real_points": int(len(x)),
        "real_converged": int(conv.sum()),
        "real_at_optimum_frac": round(float(at_opt[conv].mean()), 5),
        "real_at_optimum_all_frac": round(float(at_opt.mean()), 5),
        "real_reference": source,
        "real_steps_sigmoid": round(float(fit.n_iter.mean()), 3),
        "real_steps_two_sigmoids": round(float(fit.n_iter2.mean()), 3),
    }


def store_mode(tokens: int, rows: int, seed: int, only_full: bool = False, against: str | None = None,
               pairs: int = 6, backend: str = "auto") -> None:
    """Write a float16 store of planted events, then time `tokdyn fit` on it in a child process
    (with ``against``: the full record by this checkout and by revision ``against``, alternated)."""
    rng = np.random.default_rng(seed)
    steps = np.unique(np.round(np.geomspace(100, 1_000_000, rows)).astype(np.int64))  # distinct integers
    x = np.log10(steps)
    mu = rng.uniform(x[0] + 0.1 * (x[-1] - x[0]), x[-1] - 0.1 * (x[-1] - x[0]), tokens)
    s = rng.uniform(0.05, 0.5, tokens)
    linf = rng.uniform(1.0, 3.0, tokens)
    delta = rng.uniform(1.0, 6.0, tokens)
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(tokens, dtype=np.int32), "token_pos": np.ones(tokens, np.int32)})
    out = {"bench": "fit_store" if against is None else "fit_store_against", "tokens": tokens, "rows": int(len(steps)),
           "dtype": "float16"}  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        url = f"{d}/bench.zarr"
        st = tokdyn.open_store(url, probe, mode="w")
        w = st.create_run("r", capacity=len(steps), dtype="float16").writer()
        t0 = time.perf_counter()
        for j, step in enumerate(steps):  # one row at a time, as the recorder writes
            row = linf + delta / (1 + np.exp((x[j] - mu) / s)) + 0.2 * rng.standard_normal(tokens)
            w.append(row.astype(np.float32), step=int(step), warn_nonfinite=False)
        out["write_s"] = round(time.perf_counter() - t0, 1)
        out["load_avg_before"] = round(os.getloadavg()[0], 2)
        chosen = [] if backend == "auto" else ["--backend", backend]
        if against is not None:
            out.update(_store_against(url, against, pairs, d, chosen))
        else:
            runs = [("full", []), ("sigmoid_only", ["--no-two-step"])]
            runs += [(f"sigmoid_only_{sch}", ["--no-two-step", "--scheduler", sch]) for sch in ("sync", "processes")]
            for label, extra in runs[:1] if only_full else runs:
                out[label] = _fit_child(url, [*extra, *chosen], HERE)
                fit = tokdyn.fit.read_fit(url, "r", fields=("mu",))
                out[label]["mu_mae"] = round(float(np.nanmedian(np.abs(fit["mu"] - mu))), 5)
            out["note"] = "peak_rss_MB is the largest child so far (RUSAGE_CHILDREN keeps the maximum)"
    out["load_avg_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


def _fit_child(url: str, extra: list[str], where: str) -> dict:
    """`tokdyn fit --refit` of the store at ``url`` by the package in ``where``, as a child
    process: its wall and CPU seconds, fits/s, peak memory so far, scheduler and backend."""
    import resource

    code = "import sys; from tokdyn.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, "fit", url, "--run", "r", "--refit", "--no-progress", "--json", *extra]
    t0 = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=where, env={**os.environ, "PYTHONPATH": where}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"bench_fit: `tokdyn fit` in {where} failed: {proc.stderr[-2000:]}")
    res = json.loads(proc.stdout)
    return {
        "wall_s": round(wall, 2),
        # CPU seconds of the child (all threads): what the run costs whatever the load; on 2
        # idle cores the wall time would be about cpu_s / 2 at best
        "cpu_s": round((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime), 1),
        "fits_per_s": round(res["n_tokens"] / wall),
        "peak_rss_MB": round(ru1.ru_maxrss / 1024),
        "scheduler": res["scheduler"],
        "backend": res["backend"],
    }


def _store_against(url: str, rev: str, pairs: int, tmp: str, extra: list[str]) -> dict:
    """The full record of the store at ``url`` by this checkout and by ``rev`` (a worktree),
    each fitted once untimed (its kernels compiled into its own cache), then ``pairs``
    alternated pairs; whether both stored the same fit (a digest of every field)."""
    sides = _sides(rev)
    walls = {"base": [], "head": []}
    digests = {}
    with _revision_tree(sides["base"], tmp) as tree:
        trees = {"base": tree, "head": HERE}
        for who, where in trees.items():  # untimed: compile each tree's kernels once
            _fit_child(url, extra, where)
            digests[who] = _digest(tokdyn.fit.read_fit(url, "r"))
        for i in range(pairs):
            for who in _alternated(i):
                walls[who].append(_fit_child(url, extra, trees[who])["wall_s"])
    return {**sides, "pairs": pairs, "wall_s": walls,
            **_spread("speedup", [b / h for b, h in zip(walls["base"], walls["head"])]),
            "identical_fits": digests["base"] == digests["head"]}  # fmt: skip


def _digest(fields: dict) -> str:
    """A digest of every field of a fit (identical fits, identical digest)."""
    import hashlib

    h = hashlib.sha256()
    for name, values in sorted(fields.items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(values).tobytes())
    return h.hexdigest()


# The compiled kernels a numba fit calls, by module (tokdyn.fit.varpro, numba_kernels): the
# time outside them is the fit's serial numpy and Python.
KERNELS = {"varpro": ("grid_start_block", "varpro_block", "two_start_block"),
           "numba_kernels": ("prepare_block", "inverse_diagonal")}


def outside_kernels(x, Y, two_step: bool) -> float:
    """The share of one numba fit's wall time spent outside its compiled kernels (each kernel
    call timed from Python, the module functions wrapped for the one fit)."""
    import importlib

    spent = [0.0]
    saved = []

    def timed(fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0
        return call

    for module, names in KERNELS.items():
        mod = importlib.import_module(f"tokdyn.fit.{module}")
        for name in names:
            saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, timed(getattr(mod, name)))
    try:
        t0 = time.perf_counter()
        fit_sigmoids(x, Y, backend="numba", two_step=two_step)
        wall = time.perf_counter() - t0
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
    return round(1.0 - spent[0] / wall, 3)


def timed_fits(rows: str, repeat: int, backend: str) -> dict:
    """fits/s of the sigmoid alone and of the full record on the rows of ``rows`` (an .npz of
    x [K] and Y [B, K]; best of ``repeat``), and a digest of every field of the full record's
    fit (identical fits, identical digest)."""
    with np.load(rows) as f:
        x, Y = f["x"], f["Y"]
    fit_sigmoids(x, Y[:256], backend=backend)  # compile / load kernels
    best = {"sigmoid": np.inf, "full": np.inf}
    for _ in range(repeat):
        for label, two in (("sigmoid", False), ("full", True)):
            t0 = time.perf_counter()
            fit = fit_sigmoids(x, Y, backend=backend, two_step=two)
            best[label] = min(best[label], time.perf_counter() - t0)
    n = len(Y)
    return {"fits_per_s": n / best["sigmoid"], "full_fits_per_s": n / best["full"], "digest": _digest(fit.to_dict())}


# This checkout's root: the "head" side of --against and --compile.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", HERE, *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench_fit: git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


@contextlib.contextmanager
def _revision_tree(rev: str, tmp: str):
    """A temporary git worktree of ``rev`` in ``tmp`` (the "base" side), removed after."""
    tree = os.path.join(tmp, "base")
    _git("worktree", "add", "--detach", tree, rev)
    try:
        yield tree
    finally:
        _git("worktree", "remove", "--force", tree)


def _child(args: list[str], where: str, **env: str) -> dict:
    """This script run with ``args`` in the tree ``where`` (its own package first on the path,
    whatever is installed; ``env`` added); its JSON line."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args], cwd=where,
                          env={**os.environ, "PYTHONPATH": where, **env},
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench_fit: the child in {where} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def _sides(rev: str) -> dict:
    """The two sides of an A/B against ``rev``: the short hashes of ``rev`` (base) and of HEAD,
    and whether the working tree's tokdyn/ differs from HEAD (the head side is the working tree)."""
    return {"base": _git("rev-parse", "--short", rev), "head": _git("rev-parse", "--short", "HEAD"),
            "head_uncommitted_changes": bool(_git("status", "--porcelain", "--", "tokdyn"))}


def _spread(name: str, ratios: list[float]) -> dict:
    """``<name>_median`` and ``<name>_range`` of the per-pair speed-ups ``ratios``."""
    return {f"{name}_median": round(float(np.median(ratios)), 3),
            f"{name}_range": [round(min(ratios), 3), round(max(ratios), 3)]}


def _alternated(i: int) -> tuple[str, str]:
    """The order of the two sides in the i-th pair: base first, then head first, ..."""
    return ("base", "head") if i % 2 == 0 else ("head", "base")


def against_mode(rev: str, pairs: int, n: int, points: int, noise: float, seed: int,
                 repeat: int, backend: str) -> None:
    """Time this checkout against revision ``rev`` in alternated child processes (module doc)."""
    child = ["--repeat", str(repeat), "--backend", backend, "--child"]
    sides = _sides(rev)
    with tempfile.TemporaryDirectory() as tmp:
        # the same rows for both sides, planted here (not by each revision's own code)
        x = log_axis(np.geomspace(10.0, 1e5, points))
        Y = plant_sigmoids(n, x, rng=np.random.default_rng(seed), noise=noise).Y
        data, warm = os.path.join(tmp, "rows.npz"), os.path.join(tmp, "warm.npz")
        np.savez(data, x=x, Y=Y)
        np.savez(warm, x=x, Y=Y[:300])
        with _revision_tree(sides["base"], tmp) as tree:
            for where in (tree, HERE):  # compile each tree's kernels once, untimed
                _child([*child, warm], where)
            load = [round(os.getloadavg()[0], 2)]
            rows = []
            for i in range(pairs):
                rows.append({who: _child([*child, data], tree if who == "base" else HERE)
                             for who in _alternated(i)})
    load.append(round(os.getloadavg()[0], 2))

    def ratios(key):
        return [r["head"][key] / r["base"][key] for r in rows]

    out = {
        "bench": "fit_against", **sides,
        "pairs": pairs, "n": n, "points": points, "backend": backend,
        "fits_per_s": [[round(r["base"]["fits_per_s"]), round(r["head"]["fits_per_s"])] for r in rows],
        "full_fits_per_s": [[round(r["base"]["full_fits_per_s"]), round(r["head"]["full_fits_per_s"])]
                            for r in rows],
        **_spread("speedup", ratios("fits_per_s")),
        **_spread("full_speedup", ratios("full_fits_per_s")),
        "identical_fits": all(r["head"]["digest"] == r["base"]["digest"] for r in rows),
        "load_avg": load,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(out))


def first_fit_times(rows: str, backend: str) -> dict:
    """Seconds of the first sigmoid-only fit and then the first full record of the rows of
    ``rows`` (an .npz of x, Y) in this process: with an empty numba cache, the compile."""
    with np.load(rows) as f:
        x, Y = f["x"], f["Y"]
    t0 = time.perf_counter()
    fit_sigmoids(x, Y, backend=backend, two_step=False)
    t1 = time.perf_counter()
    fit_sigmoids(x, Y, backend=backend)
    t2 = time.perf_counter()
    return {"sigmoid_s": t1 - t0, "full_s": t2 - t1}


def compile_mode(rev: str | None, pairs: int, backend: str) -> None:
    """The first fit with an empty numba cache and again from the cache it left (module doc),
    for this checkout and, with ``rev``, for REV's tree alternately."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        x = log_axis(np.geomspace(10.0, 1e5, 100))
        data = os.path.join(tmp, "rows.npz")
        np.savez(data, x=x, Y=plant_sigmoids(256, x, rng=np.random.default_rng(0), noise=0.2).Y)
        sides = {"head": HERE}
        if rev is not None:
            sides["base"] = stack.enter_context(_revision_tree(rev, tmp))
        runs = {who: [] for who in sides}
        for i in range(pairs if rev is not None else 1):
            for who in (w for w in _alternated(i) if w in sides):
                cache = tempfile.mkdtemp(dir=tmp)
                args = ["--backend", backend, "--compile-child", data]
                cold = _child(args, sides[who], NUMBA_CACHE_DIR=cache)
                warm = _child(args, sides[who], NUMBA_CACHE_DIR=cache)  # loads what cold compiled
                runs[who].append({"first_sigmoid_s": round(cold["sigmoid_s"], 2),
                                  "first_full_s": round(cold["full_s"], 2),
                                  "first_s": round(cold["sigmoid_s"] + cold["full_s"], 2),
                                  "cached_s": round(warm["sigmoid_s"] + warm["full_s"], 2),
                                  "cache_files": sum(len(f) for _, _, f in os.walk(cache))})
    out = {"bench": "fit_compile", "rows": 256, "backend": backend, "runs": runs,
           "first_s_median": {who: float(np.median([r["first_s"] for r in rs]))
                              for who, rs in runs.items()}}
    if rev is not None:
        out["base"] = rev
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="trajectories fitted by tokdyn")
    ap.add_argument("--n-scipy", type=int, default=2000, help="trajectories fitted by scipy")
    ap.add_argument("--backend", default="auto", choices=["auto", *available_backends()])
    ap.add_argument("--device", default=None, help="torch device (backend torch)")
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--noise", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3,
                    help="time tokdyn's sigmoid fit and the scipy loop this many times, keep "
                         "the fastest (the least disturbed on a shared machine)")
    default_real = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "tiny_gpt_real.npz")
    ap.add_argument("--real", default=default_real if os.path.exists(default_real) else None,
                    help="npz of real trajectories (x, Y[, ref_sse]); '' to skip")
    ap.add_argument("--real-n", type=int, default=300,
                    help="rows of --real to compute the multi-start reference for, when the file has none")
    ap.add_argument("--store-tokens", type=int, help="store mode: tokens in the store")
    ap.add_argument("--store-rows", type=int, default=200, help="store mode: checkpoints in the store")
    ap.add_argument("--store-full-only", action="store_true", help="store mode: time the full record only")
    ap.add_argument("--against", metavar="REV", help="time this checkout against git revision REV "
                    "(alternated child processes; see the module doc)")
    ap.add_argument("--pairs", type=int, default=6, help="--against: alternated pairs of runs")
    ap.add_argument("--child", metavar="ROWS", help=argparse.SUPPRESS)  # time the fits of an .npz
    ap.add_argument("--compile", action="store_true",
                    help="time the first fit with an empty numba cache (module doc)")
    ap.add_argument("--compile-child", metavar="ROWS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compile_child:
        print(json.dumps(first_fit_times(args.compile_child, args.backend)))
        return
    if args.compile:
        if args.pairs < 1:
            raise SystemExit("bench_fit: --pairs must be >= 1")
        compile_mode(args.against, args.pairs, args.backend)
        return
    if args.child:
        print(json.dumps(timed_fits(args.child, args.repeat, args.backend)))
        return
    if args.store_tokens:
        if args.against and args.pairs < 1:
            raise SystemExit("bench_fit: --pairs must be >= 1")
        store_mode(args.store_tokens, args.store_rows, args.seed, args.store_full_only, args.against,
                   args.pairs, args.backend)
        return
    if args.against:
        if args.pairs < 1 or args.n < 1 or args.repeat < 1:
            raise SystemExit("bench_fit: --pairs, --n and --repeat must be >= 1")
        against_mode(args.against, args.pairs, args.n, args.points, args.noise, args.seed,
                     args.repeat, args.backend)
        return

    x = log_axis(np.geomspace(10.0, 1e5, args.points))  # 4 decades, log-spaced checkpoints
    planted = plant_sigmoids(args.n, x, rng=np.random.default_rng(args.seed), noise=args.noise)
    Y, mu_true = planted.Y, planted.truth["mu"]
    backend, device = resolve_backend(args.backend, args.device)

    t0 = time.perf_counter()
    fit_sigmoids(x, Y[:256], backend=backend, device=device)  # compile / load kernels
    warmup_s = time.perf_counter() - t0

    Y_lost = Y.copy()
    Y_lost[:, args.points // 3] = np.nan  # one checkpoint lost for every trajectory
    load_before = os.getloadavg()[0]
    tokdyn_s = full_s = lost_s = np.inf
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        fit = fit_sigmoids(x, Y, backend=backend, device=device, two_step=False)
        tokdyn_s = min(tokdyn_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        full = fit_sigmoids(x, Y, backend=backend, device=device)
        full_s = min(full_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        fit_sigmoids(x, Y_lost, backend=backend, device=device, two_step=False)
        lost_s = min(lost_s, time.perf_counter() - t0)

    m = min(args.n_scipy, args.n)
    scipy_s = np.inf
    for _ in range(args.repeat):
        p_sc, sse_sc, seconds = scipy_loop(x, Y[:m])
        scipy_s = min(scipy_s, seconds)
    conv = np.isfinite(sse_sc)
    below, sse_ref = bounded_reference(x, Y[:m], p_sc, sse_sc)
    agree = fit.sse[:m][conv] <= sse_ref[conv] * (1 + 1e-6)

    result = {
        "bench": "fit_sigmoid",
        "n": args.n,
        "n_scipy": m,
        "points": args.points,
        "noise": args.noise,
        "backend": backend if device is None else f"{backend}:{device}",
        "fits_per_s": round(args.n / tokdyn_s, 1),
        "full_fits_per_s": round(args.n / full_s, 1),
        "lost_row_fits_per_s": round(args.n / lost_s, 1),
        "lost_row_slowdown": round(lost_s / tokdyn_s, 2),
        "scipy_fits_per_s": round(m / scipy_s, 1),
        "speedup": round((args.n / tokdyn_s) / (m / scipy_s), 1),
        "full_speedup": round((args.n / full_s) / (m / scipy_s), 1),
        "agree_frac": round(float(agree.mean()), 5),
        "scipy_converged": int(conv.sum()),
        "scipy_below_floor": int((below & conv).sum()),
        "mu_mae_tokdyn": round(float(np.median(np.abs(fit.mu - mu_true))), 5),
        "mu_mae_tokdyn_subset": round(float(np.median(np.abs(fit.mu[:m] - mu_true[:m]))), 5),
        "mu_mae_scipy": round(float(np.median(np.abs(p_sc[conv, 2] - mu_true[:m][conv]))), 5),
        "tokdyn_s": round(tokdyn_s, 3),
        "full_s": round(full_s, 3),
        "scipy_s": round(scipy_s, 3),
        "warmup_s": round(warmup_s, 3),
        "repeat": args.repeat,
        "status_converged_frac": round(float(np.mean(fit.status == 0)), 5),
        "outside_kernels_frac": ({"sigmoid": outside_kernels(x, Y, False),
                                  "full": outside_kernels(x, Y, True)}
                                 if backend == "numba" else None),
        "steps_sigmoid": round(float(fit.n_iter.mean()), 3),
        "steps_two_sigmoids": round(float(full.n_iter2.mean()), 3),
        "full_multi_step_frac": round(float(np.mean(full.class_name == "multi_step")), 5),
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        **real_figures(args.real, args.real_n, backend, device),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
