"""Measurement: `tokdyn compare` on planted runs with a known shift, over the range both runs
observed (the rule before) and each over its own range with the tokens cut by a range edge
counted apart (``compare_runs`` now).

Per seed, run A is planted over log10 steps 1..5 (one sigmoid a token, ``plant_sigmoids``,
its learning times across the whole range, so range edges cut some of them), and B is:

- ``x10``, ``x3``: A's schedule with every step times 10 (3): true shift log10 c for every token;
- ``range2-6``: the same schedule recorded over steps 100..1,000,000: true shift 0;
- ``half``: half the tokens learned 0.5 decades earlier, the rest as A: true shift -0.5 / 0;
- ``x10copy``: A's losses themselves, every step times 10: true shift 1 and no fitting noise;
- ``again``: the same schedule and steps, B's own noise: the fitting noise alone (true shift 0);
- ``same``: A's losses themselves: shift exactly 0, and compare(B, A) = -compare(A, B).

B's noise is its own (but for ``x10copy`` and ``same``). Rules: ``before`` (each run's times over
the range both observed), ``own ranges`` (each over its own), ``now@W`` (compare_runs: over the
range both observed, a token censored where that range shows less than W of the falling drop
one run saw). Prints a row a case and rule: tokens compared and censored, their error against
the true shift (median, 5 % and 95 % quantiles), the tokens past the tolerance (0.05 decades)
and the share of A's drop they carry (mean over seeds).

    python pipelines/compare_edge_bias.py [--seeds 0 1 2] [--tokens 200] [--whole 0.9 0.95 0.98]
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

import tokdyn
from tokdyn.compare import compare_runs
from tokdyn.fit.job import fit_run
from tokdyn.fit.sigmoid import sigmoid_curve
from tokdyn.fit.synthetic import plant_sigmoids

STEPS = np.unique(np.round(np.geomspace(10, 100_000, 30)).astype(np.int64))
TOL = 0.05
CASES = ("x10", "x10copy", "x3", "range2-6", "half", "again", "same")


def _write(st, name: str, steps: np.ndarray, Y: np.ndarray) -> None:
    with st.create_run(name, capacity=len(steps)).writer() as w:
        for j, step in enumerate(steps):
            w.append(Y[:, j].astype(np.float32), step=int(step))
    fit_run(st.run(name), progress=False)


def planted_store(path, n: int, seed: int):
    """Store of run A and one run B a case; returns it and each case's true shift [N]."""
    rng = np.random.default_rng(seed)
    x = np.log10(STEPS.astype(float))
    p = plant_sigmoids(n, x, rng=rng, noise=0.05, mu_range=(1.0, 5.0), s_range=(0.05, 0.2), delta_range=(1.0, 4.0))
    t = p.truth
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st = tokdyn.open_store(path, probe, mode="w")
    _write(st, "A", STEPS, p.Y)

    def curve(xb, mu):
        return sigmoid_curve(xb[None, :], t["l0"][:, None], t["linf"][:, None], mu[:, None], t["s"][:, None]) \
            + 0.05 * rng.standard_normal((n, xb.size))  # fmt: skip

    truth = {}
    for case, c in (("x10", 10), ("x3", 3)):
        _write(st, case, STEPS * c, curve(x + np.log10(c), t["mu"] + np.log10(c)))
        truth[case] = np.full(n, np.log10(c))
    _write(st, "x10copy", STEPS * 10, p.Y)  # A's losses themselves, every step times 10
    truth["x10copy"] = np.ones(n)
    _write(st, "range2-6", STEPS * 10, curve(x + 1, t["mu"]))
    truth["range2-6"] = np.zeros(n)
    moved = np.where(np.arange(n) % 2 == 0, -0.5, 0.0)
    _write(st, "half", STEPS, curve(x, t["mu"] + moved))
    truth["half"] = moved
    _write(st, "again", STEPS, curve(x, t["mu"]))  # the fitting noise alone
    truth["again"] = np.zeros(n)
    _write(st, "same", STEPS, p.Y)
    truth["same"] = np.zeros(n)
    return st, truth


RULES = ("before", "own ranges", "now")


def times(st, case: str, rule: str):
    """(compared [N], shift [N], censored count, A's drop [N]) by ``rule``: each run's times over
    the range both observed (before), over its own, or compare_runs' now (over the range both
    observed, with the tokens that range cuts in one run only censored; checked against its
    counts)."""
    from tokdyn.compare import WHOLE_SHARE, _common_range, _open_fit, _run_times

    runs = [st.run(r) for r in ("A", case)]
    fits = [_open_fit(r) for r in runs]
    common = _common_range(*fits, *runs)
    t = [_run_times(f, f.x_range if rule == "own ranges" else common, whole_of=f.x_range) for f in fits]
    learned = np.isfinite(t[0].mu) & np.isfinite(t[1].mu)
    cens = learned & ((t[0].whole < WHOLE_SHARE) | (t[1].whole < WHOLE_SHARE)) & (rule == "now")
    if rule == "now":
        res = compare_runs(st, "A", case)
        assert res["overall"]["n_tokens"] == (learned & ~cens).sum() and res["censored"]["n_tokens"] == cens.sum()
    return learned & ~cens, t[1].mu - t[0].mu, int(cens.sum()), t[0].drop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--whole", type=float, nargs="+", default=None, help="WHOLE_SHARE values to try")
    args = ap.parse_args()
    import tokdyn.compare as compare

    wholes = args.whole or [compare.WHOLE_SHARE]
    rows: dict = {}
    with tempfile.TemporaryDirectory() as d:
        for seed in args.seeds:
            st, truth = planted_store(f"{d}/s{seed}.zarr", args.tokens, seed)
            for case in CASES:
                for whole in wholes:
                    compare.WHOLE_SHARE = whole
                    for rule in RULES:
                        if rule != "now" and whole != wholes[0]:
                            continue
                        ok, shift, n_cens, drop = times(st, case, rule)
                        err = shift[ok] - truth[case][ok]
                        rows.setdefault((case, rule if rule != "now" else f"now@{whole}"), []).append(
                            (err, n_cens, drop[ok][np.abs(err) > TOL].sum() / drop[ok].sum()))
                    if case == "same":
                        o, back = compare_runs(st, "A", case)["overall"], compare_runs(st, case, "A")["overall"]
                        assert (o["median_shift"], o["q25"], o["q75"]) == (-back["median_shift"], -back["q75"], -back["q25"])
                        assert o["median_shift"] == 0 and o["q25"] == 0 and o["q75"] == 0
    print(f"{len(args.seeds)} seeds x {args.tokens} tokens; error = measured shift - true shift (decades)")
    print(f"{'case':<10} {'rule':<18} {'compared':>8} {'censored':>8} {'median':>8} {'q05':>8} {'q95':>8} {'>tol':>5} {'drop>tol':>8}")
    for (case, rule), got in rows.items():
        err = np.concatenate([g[0] for g in got])
        q = np.quantile(err, [0.05, 0.5, 0.95])
        print(f"{case:<10} {rule:<18} {err.size:>8} {sum(g[1] for g in got):>8} {q[1]:>+8.4f} {q[0]:>+8.4f} {q[2]:>+8.4f} "
              f"{int((np.abs(err) > TOL).sum()):>5} {np.mean([g[2] for g in got]):>8.1%}")


if __name__ == "__main__":
    main()
