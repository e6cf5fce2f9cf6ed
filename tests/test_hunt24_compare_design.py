"""Hunt 24 on `tokdyn compare` over runs observed over different ranges: a drop the range both
runs observed cuts in one run (which saw it past the range's edge) and not in the other is
censored, counted apart, instead of read as a shift the edge made. Planted runs whose answer is
known: run A over log10 steps 1..5 with learning times across the whole range, and runs B of A's
own losses with every step times c (shift log10 c, no fitting noise between them), of the same
schedule over 2..6 (shift 0), of half the tokens 0.5 decades earlier (same range) and of A's
losses far later (no token seen whole). pipelines/compare_edge_bias.py measures the same on more
seeds and tokens, with each run's own noise."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tokdyn
from tokdyn.compare import compare_runs
from tokdyn.errors import InputError
from tokdyn.fit.job import fit_run
from tokdyn.fit.sigmoid import sigmoid_curve
from tokdyn.fit.synthetic import plant_sigmoids

from reliability_fixtures import cli_error_line, run_cli

STEPS = np.unique(np.round(np.geomspace(10, 100_000, 30)).astype(np.int64))  # log10 1..5
N = 160


def _write(st, name, steps, Y):
    with st.create_run(name, capacity=len(steps)).writer() as w:
        for j, step in enumerate(steps):
            w.append(Y[:, j].astype(np.float32), step=int(step))
    fit_run(st.run(name), progress=False)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    rng = np.random.default_rng(24)
    x = np.log10(STEPS.astype(float))
    p = plant_sigmoids(N, x, rng=rng, noise=0.05, mu_range=(1.0, 5.0), s_range=(0.05, 0.2), delta_range=(1.0, 4.0))
    t = p.truth
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(N, dtype=np.int32), "token_pos": np.ones(N, np.int32)})
    st = tokdyn.open_store(tmp_path_factory.mktemp("h24") / "s.zarr", probe, mode="w")

    def losses(xb, mu):
        return sigmoid_curve(xb[None, :], t["l0"][:, None], t["linf"][:, None], mu[:, None], t["s"][:, None]) \
            + 0.05 * rng.standard_normal((N, xb.size))  # fmt: skip

    _write(st, "A", STEPS, p.Y)
    for c in (3, 10):
        _write(st, f"x{c}", STEPS * c, p.Y)  # A's losses, every step times c
    _write(st, "later", np.round(STEPS * 10**3.8).astype(np.int64), p.Y)  # A's, 3.8 decades later
    _write(st, "to99000", np.r_[STEPS[:-1], 99_000], p.Y)  # A's, its last step 1 % earlier
    _write(st, "range2-6", STEPS * 10, losses(x + 1, t["mu"]))  # A's schedule over log10 steps 2..6
    moved = np.where(np.arange(N) % 2 == 0, -0.5, 0.0)
    _write(st, "half", STEPS, losses(x, t["mu"] + moved))
    return st, t["mu"], moved


def _shifts(st, a, b):
    """Each token's shift by compare's own times (token_times over the range both observed)."""
    from tokdyn.compare import token_times

    res = compare_runs(st, a, b)
    mu = [token_times(st, r, x_range=res["x_range"]).mu for r in (a, b)]
    return res, mu[1] - mu[0]


@pytest.mark.parametrize("c", [10, 3])
def test_every_step_times_c_reads_a_shift_of_log10_c_or_censors(planted, c):
    """B is A's losses with every step times c: every token learned log10 c later. Over the range
    both observed, a drop A saw whole near its start was cut there in B (and one B saw near its
    end, in A), and read earlier: a median 0.14 decades short at c = 10 and 58 % of the drop past
    the 0.05 tolerance (pipelines/compare_edge_bias.py; here a median of 0.87 for 1, 0.45 for
    0.48). Now those tokens are censored, counted apart; the ones compared read log10 c."""
    st, mu, _ = planted
    res = compare_runs(st, "A", f"x{c}")
    o, true = res["overall"], np.log10(c)
    assert o["median_shift"] == pytest.approx(true, abs=0.02), o
    assert o["q25"] > true - 0.05 and o["q75"] < true + 0.02 and o["drop_share_earlier"] < 0.15, o
    cens = res["censored"]
    assert cens["n_tokens"] > 0 and 0 < cens["drop_share"] < 1 and cens["whole_share"] == 0.95
    assert o["n_tokens"] + cens["n_tokens"] <= min(res["n_learned"].values())
    # the compared tokens are those learned well inside the range both observed, in both runs
    from tokdyn.compare import token_times

    lo, hi = res["x_range"]

    a, b = token_times(st, "A", x_range=(lo, hi)).mu, token_times(st, f"x{c}", x_range=(lo, hi)).mu
    learned = np.isfinite(a) & np.isfinite(b)
    assert o["n_tokens"] == learned.sum() - cens["n_tokens"]
    assert np.quantile((b - a)[learned], 0.25) < true - 0.05  # the censored ones in (the rule before): the bias


def test_the_compared_tokens_were_learned_inside_the_range_both_observed(planted):
    """Independent answer: censored or not follows from the planted learning times. A token
    planted well inside the range both observed in both runs (log10 2.5..3.5 of A at c = 10) is
    compared; one planted outside it in either run (A before 2, or after 4) is never compared."""
    st, mu, _ = planted
    res, shift = _shifts(st, "A", "x10")
    assert res["x_range"] == pytest.approx([2.0, 5.0], abs=0.01)
    learned = np.isfinite(shift)
    inside, outside = learned & (mu > 2.5) & (mu < 3.5), learned & ((mu < 1.9) | (mu > 4.1))
    assert outside.sum() > 40 and inside.sum() > 20
    n = res["overall"]["n_tokens"]
    assert inside.sum() <= n <= learned.sum() - outside.sum()  # inside ones compared, outside ones censored
    assert res["censored"]["n_tokens"] >= outside.sum()


def test_the_same_schedule_over_shifted_ranges_reads_no_shift(planted):
    """A's schedule recorded over log10 steps 2..6: true shift 0 for every token. Reading each run
    over its own range read 12 % of the drop "moved later" (noise events fitted where only one
    run observed); over the range both observed it is 0 and stays so, the drops that B cuts at
    step 100 (A saw them whole) censored."""
    st, mu, _ = planted
    res = compare_runs(st, "A", "range2-6")
    o = res["overall"]
    assert abs(o["median_shift"]) < 0.01 and abs(o["q25"]) < 0.05 and abs(o["q75"]) < 0.05, o
    assert o["drop_share_later"] < 0.15 and o["drop_share_earlier"] < 0.15  # (fitting noise: 11 % earlier before, 11 % now)
    assert res["censored"]["cut_in"]["A"] > 0  # A saw them past 2, where the range both observed cuts them


def test_runs_over_one_range_censor_nothing_and_keep_a_partial_shift(planted):
    """Half the tokens learned 0.5 decades earlier, the rest as A, over the same steps: an edge
    both runs share cuts a drop in both alike and censors nothing."""
    st, mu, moved = planted
    res, shift = _shifts(st, "A", "half")
    assert res["censored"]["n_tokens"] == 0 and res["censored"]["drop_share"] == 0
    inner = (mu > 2.0) & (mu < 4.5)  # both events seen whole
    assert np.median(shift[inner & (moved < 0)]) == pytest.approx(-0.5, abs=0.03)
    assert np.median(shift[inner & (moved == 0)]) == pytest.approx(0.0, abs=0.03)


def test_a_range_a_hair_shorter_censors_nothing(planted):
    """The same losses with the last step at 99,000 instead of 100,000 (0.004 decades): the
    range both observed shows the drops the other run saw there to within far less than 5 %, so
    nothing is censored and every shift is that of the points (none past the tolerance)."""
    st, _, _ = planted
    res = compare_runs(st, "A", "to99000")
    assert res["censored"]["n_tokens"] == 0 and res["overall"]["n_tokens"] == min(res["n_learned"].values())
    assert res["overall"]["drop_share_earlier"] + res["overall"]["drop_share_later"] < 0.02


@pytest.mark.parametrize("b", ["x10", "range2-6", "half"])
def test_compare_is_mirrored(planted, b):
    """compare(B, A) is compare(A, B) mirrored: the same tokens compared and censored, the median
    and quartiles negated; identical runs read exactly 0."""
    st, _, _ = planted
    ab, ba = compare_runs(st, "A", b), compare_runs(st, b, "A")
    assert ab["censored"]["n_tokens"] == ba["censored"]["n_tokens"]
    assert ab["censored"]["cut_in"] == ba["censored"]["cut_in"]
    o, r = ab["overall"], ba["overall"]
    assert o["n_tokens"] == r["n_tokens"] and (o["median_shift"], o["q25"], o["q75"]) == (-r["median_shift"], -r["q75"], -r["q25"])
    if b == "half":  # over one range: the shifts of compare(A, A') are those of each token, mirrored
        assert ab["censored"]["n_tokens"] == 0


def test_no_token_seen_whole_in_both_is_one_line(planted, capsys):
    """A's losses 3.8 decades later: the range both observed is log10 4.8..5, where no drop of
    either run lies whole. Before, the shifts of the drops' cut tails were read as shifts
    (median about 0: "nothing moved", where everything moved 3.8 decades); now one line."""
    st, _, _ = planted
    with pytest.raises(InputError, match=r"no probe token has a positive learning event in both 'A' and 'later' seen "
                                         r"whole over the range both observed \(\d+ cut by its edge in one run\)"):
        compare_runs(st, "A", "later")
    code, err = run_cli(["compare", str(st.url), "--run", "A", "--run", "later"], capsys)
    assert code == 1 and "seen whole over the range both observed" in cli_error_line(err)


def test_the_cli_prints_the_censored_tokens(planted, capsys):
    from tokdyn.cli import main

    st, _, _ = planted
    assert main(["compare", str(st.url), "--run", "A", "--run", "x10", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    cens = res["censored"]
    assert main(["compare", str(st.url), "--run", "A", "--run", "x10"]) == 0
    out = capsys.readouterr().out
    assert f"{res['overall']['n_tokens']} of {N} tokens with an event in both seen whole over the range both observed" in out
    assert f"censored (not in the shifts): {cens['n_tokens']} tokens learned in both, {cens['drop_share']:.1%} of the drop in 'A'" in out
    assert f"(in 'A': {cens['cut_in']['A']}, in 'x10': {cens['cut_in']['x10']})" in out
    assert main(["compare", str(st.url), "--run", "A", "--run", "half"]) == 0
    out = capsys.readouterr().out  # one range: nothing censored, nothing said
    assert "censored" not in out and "seen whole" not in out
