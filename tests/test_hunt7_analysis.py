"""spectrum, reconstruct and report checked against numbers computed by hand (hunt 7).

- The spectra by class, domain, frequency and position band are parts of the whole spectrum
  ("so they add up to it", docs/spectrum.md): they were made from every scored token and
  normalised by all of them, where the whole leaves out the tokens its measured mean left out
  (tokens missing a loss at some rows) and is normalised by the tokens kept; and
  ``tokdyn spectrum --kernel delta --by ...`` split with the event kernel. Neither added up.
- ``tokdyn spectrum --by``: a group whose loss rose (forgotten tokens, rho < 0 throughout) had
  its "peak" printed where rho is nearly 0, far from its rise; its histogram bins had no bars.
- The report's spectrum figure: its log panel dropped every bin and every part of the density
  where rho < 0 (the caption said every bin was kept in view); its grey "outside the recorded
  range" spanned no width (the grid is the recorded range) yet stood in the legend.
- The report's table of scores printed "[nan, nan]" for an exponent without an interval and
  "n/a" for a refused power law, without the reason the command line gives.
"""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

import tokdyn
from tokdyn.analysis import analyze_run
from tokdyn.cli import main

STEPS = np.unique(np.round(np.geomspace(10, 10_000, 20)).astype(np.int64))
X = np.log10(STEPS)
BYTE = {"kind": "byte", "vocab_size": 257, "eot_id": 256}


def _store(path, Y: np.ndarray, *, ctx: int = 4, seed: int = 0) -> tokdyn.TrajectoryStore:
    """A fitted run 'r' of the losses Y [N, K] on a byte probe of N / ctx sequences, 2 domains."""
    rng = np.random.default_rng(seed)
    n_seq = Y.shape[0] // ctx
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(97, 123, size=(n_seq, ctx + 1)), domain=np.arange(n_seq) % 2,
                                        domains=("a", "b"), tokenizer=BYTE)  # fmt: skip
    s = tokdyn.open_store(str(path), probe, mode="w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN losses are said when stored
        with s.create_run("r", capacity=len(STEPS)).writer() as w:
            for j, step in enumerate(STEPS):
                w.append(Y[:, j].astype(np.float32), step=int(step))
    tokdyn.fit_run(s.run("r"), progress=False)
    return s


def _sigmoids(mu, drop, *, s=0.12, noise=0.02, seed=0, base=1.0):
    """[N, K] one-step trajectories: a drop (< 0: a rise) of ``drop`` nats at ``mu`` decades."""
    mu, drop = np.asarray(mu, float), np.broadcast_to(np.asarray(drop, float), np.shape(mu))
    rng = np.random.default_rng(seed)
    level = base + np.where(drop < 0, -drop, 0.0)  # every loss stays above base
    clean = level[:, None] + drop[:, None] * (1 / (1 + np.exp((X[None, :] - mu[:, None]) / s)) - (drop < 0)[:, None])
    return clean + noise * rng.standard_normal(clean.shape)


@pytest.fixture(scope="module")
def partial_store(tmp_path_factory):
    """120 learned tokens; 20 of them (one in six) miss a loss at the first 3 rows, so the
    measured mean (and with it the whole spectrum) is over the other 100."""
    rng = np.random.default_rng(1)
    Y = _sigmoids(rng.uniform(1.5, 3.5, 120), rng.uniform(1, 3, 120))
    Y[::6, :3] = np.nan
    return _store(tmp_path_factory.mktemp("partial") / "s.zarr", Y)


@pytest.fixture(scope="module")
def rising_store(tmp_path_factory):
    """40 tokens learned near x 1.8 (1.5 nats), 40 forgotten near x 3.2 (a rise of 3 nats)."""
    rng = np.random.default_rng(5)
    mu = np.r_[rng.normal(1.8, 0.08, 40), rng.normal(3.2, 0.08, 40)]
    return _store(tmp_path_factory.mktemp("rising") / "s.zarr", _sigmoids(mu, np.r_[np.full(40, 1.5), np.full(40, -3.0)]))


# -- group spectra are parts of the whole ---------------------------------------------------------


def test_group_spectra_add_up_to_the_whole_when_tokens_are_left_out(partial_store):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the left-out tokens are warned about
        a = analyze_run(partial_store.run("r"), n_boot=0)
    rec, whole = a.reconstruction, a.reconstruction.spectrum
    assert rec.n_tokens_left_out == 20 and whole.n_tokens == 100  # the planted gap, by hand
    for kind, groups in a.by_group.items():
        assert sum(g.n_events for g in groups.values()) == whole.n_events, kind  # no group too small to show
        assert {g.n_tokens for g in groups.values()} == {100}, kind  # one normalisation: the whole's N
        total = sum(g.density for g in groups.values())
        np.testing.assert_allclose(total, whole.density, atol=1e-9 * np.abs(whole.density).max(), err_msg=kind)
        assert sum(g.total_drop for g in groups.values()) == pytest.approx(whole.total_drop, rel=1e-9)
    # by hand: the seen drops of the events of the tokens with a loss at every row, over their number
    kept = np.isfinite(np.asarray(partial_store.run("r").to_dask().compute(), float)).all(axis=0)
    assert kept.sum() == 100
    assert whole.total_drop == pytest.approx(a.events.for_tokens(kept).realized_drop().sum() / 100, rel=1e-9)


@pytest.mark.parametrize("kernel", ["delta", "event"])
def test_spectrum_by_splits_with_the_kernel_of_the_whole(partial_store, kernel, capsys):
    args = ["spectrum", partial_store.url, "--by", "frequency", "--boot", "0", "--kernel", kernel, "--json"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    whole = np.array(out["spectrum"]["density"])
    assert {g["kernel"] for g in out["groups"].values()} == {kernel}
    assert sum(g["n_events"] for g in out["groups"].values()) == out["n_events"]
    total = sum(np.array(g["density"]) for g in out["groups"].values())
    np.testing.assert_allclose(total, whole, atol=1e-9 * np.abs(whole).max())


# -- a group whose loss rose ----------------------------------------------------------------------


def test_cli_by_class_puts_the_peak_of_a_rise_where_the_loss_rose(rising_store, capsys):
    assert main(["spectrum", rising_store.url, "--by", "class", "--boot", "0"]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^  (\w+)\s+(-?[0-9.]+)\s+x\s+(-?[0-9.]+)\s+\d+$", out, flags=re.M)}  # fmt: skip
    fit = rising_store.run("r").fit.read(["class_code", "mu"])
    planted = {"learned": 1.8, "forgotten": 3.2}
    for name, where in planted.items():
        drop, peak = rows[name]
        assert abs(peak - where) < 0.15, (name, peak, out)  # within about one bandwidth of the planted events
        assert np.sign(drop) == (1 if name == "learned" else -1)
    assert abs(np.median(fit["mu"][40:]) - 3.2) < 0.1  # the fit agrees with the plant


def test_cli_histogram_draws_the_bins_where_the_loss_rose(rising_store, capsys):
    assert main(["spectrum", rising_store.url, "--boot", "0", "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)["spectrum"]
    hist = np.array(spec["hist"])
    assert main(["spectrum", rising_store.url, "--boot", "0"]) == 0
    bars = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  x ")]
    assert len(bars) == hist.size
    peak = np.abs(hist).max()
    for ln, v in zip(bars, hist):
        bar = ln.split("nats/decade")[1].strip()
        assert len(bar) == int(round(40 * abs(v) / peak)), ln
        assert set(bar) <= ({"#"} if v >= 0 else {"-"}), ln
    assert (hist < -0.5 * peak).any()  # the rise is the larger part: it has the longest bars


# -- the report's spectrum figure and table of scores ---------------------------------------------


def _spectrum_figure(store):
    import matplotlib

    matplotlib.use("Agg")
    from tokdyn.report import _fig_spectrum

    a = analyze_run(store.run("r"), n_boot=0, groups=False)
    return a, _fig_spectrum(store, a)


def test_the_log_panel_shows_where_rho_is_negative(rising_store):
    import matplotlib.pyplot as plt

    a, f = _spectrum_figure(rising_store)
    spec = a.reconstruction.spectrum
    try:
        log_ax = f.fig.axes[1]
        assert log_ax.get_yscale() == "log"
        drawn = np.concatenate([np.asarray(ln.get_ydata(), float) for ln in log_ax.get_lines()])
        drawn = drawn[np.isfinite(drawn)]
        # the largest |rho| is the rise's (-rho), by hand from the spectrum; it is drawn and in view
        assert spec.density.min() < -spec.density.max()
        assert drawn.max() == pytest.approx(-spec.density.min(), rel=1e-9)
        lo, hi = log_ax.get_ylim()
        assert lo <= -spec.density.min() <= hi
        heights = [p.get_height() for p in log_ax.patches if p.get_height() > 0 and p.get_width() < 1]
        assert max(heights) == pytest.approx(np.abs(spec.hist).max(), rel=1e-9)  # the largest bin is a rise's
        assert "-ρ, in red" in f.caption
    finally:
        plt.close(f.fig)


def test_the_grey_band_of_the_spectrum_figure_is_drawn_where_the_power_law_is_not_fitted(partial_store):
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, f = _spectrum_figure(partial_store)
    spec = a.reconstruction.spectrum
    try:
        for ax in f.fig.axes[:2]:
            grey = [p for p in ax.patches if to_hex(p.get_facecolor()) == "#e4e4e4"]
            spans = sorted((p.get_x(), p.get_x() + p.get_width()) for p in grey)
            lo, hi = spec.x_range
            h = spec.bandwidth
            assert spans == [pytest.approx((lo, lo + h)), pytest.approx((hi - h, hi))]  # one bandwidth at each end
        labels = f.fig.legends[0].get_texts()
        assert any("one bandwidth" in t.get_text() for t in labels)
        assert "outside the recorded range, where event times are censored" not in f.caption
    finally:
        plt.close(f.fig)


def test_the_table_of_scores_gives_the_reason_for_a_missing_law_or_interval(rising_store):
    import html

    from tokdyn.analysis import StoreAnalysis
    from tokdyn.report import _power_law_text, _scores_table

    a = analyze_run(rising_store.run("r"), n_boot=0, groups=False)
    rec = a.reconstruction
    assert rec.loss_power_law is None and rec.loss_power_law_why  # the loss rose: no loss law
    table = _scores_table(StoreAnalysis(rising_store.url, [a], [], {}))
    assert html.escape(f"n/a: {rec.loss_power_law_why}") in table
    assert "nan" not in _power_law_text({"alpha": 0.5, "alpha_ci95": [float("nan")] * 2, "r2": 0.95,
                                         "alpha_ci95_why": "too few tokens"})  # fmt: skip
    assert "no 95 % interval: too few tokens" in _power_law_text({"alpha": 0.5, "alpha_ci95": [float("nan")] * 2, "r2": 0.95,
                                                                  "alpha_ci95_why": "too few tokens"})  # fmt: skip
    assert _power_law_text({"alpha": 0.5, "alpha_ci95": [0.4, 0.6], "r2": 0.95}) == "0.50 [0.40, 0.60] (R² 0.95)"


# -- tick labels name the values where they sit; a recorded step is given in full ------------------


@pytest.mark.parametrize("lo, hi", [(3.0, 3.7), (0.0, 1.2), (2.2, 2.6), (0.5, 4.5), (-1.3, -0.4),
                                    (np.log10(120), np.log10(150)), (3.0, np.log10(1900)), (np.log10(1.5), np.log10(2.5))])
def test_every_log_tick_label_names_the_value_at_its_tick(lo, hi):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tokdyn.report import _log_ticks

    fig, ax = plt.subplots()
    ax.set_xlim(lo, hi)
    _log_ticks(ax.xaxis, lo, hi)
    fig.canvas.draw()
    shown = [(t.get_loc(), t.label1.get_text()) for t in ax.xaxis.get_major_ticks() if lo <= t.get_loc() <= hi]
    plt.close(fig)
    assert len(shown) >= 2
    for loc, text in shown:  # "3,000", "5e5", "0.2": the value at the tick, not 10^0.5 = 3.16 read as "3"
        assert float(text.replace(",", "")) == pytest.approx(10.0**loc, rel=1e-9), (loc, text)


def test_a_recorded_step_in_a_sentence_is_given_in_full():
    from tokdyn.report import _row_text

    assert _row_text(12345.0) == "12,345" and _row_text(10 ** np.log10(12345.0)) == "12,345"
    assert _row_text(3.0) == "3" and _row_text(2.5e-3) == "0.0025"


def test_a_share_of_a_rising_mean_loss_says_it_is_of_a_rise():
    from types import SimpleNamespace

    from tokdyn.reconstruct import Reconstruction
    from tokdyn.report import _share_text

    rose = Reconstruction.mean_loss_rose.fget
    assert rose(SimpleNamespace(mean_loss=np.array([np.nan, 2.0, 2.5, 3.0])))
    assert not rose(SimpleNamespace(mean_loss=np.array([3.0, 2.0, np.nan])))
    assert _share_text(0.999, True) == "99.9% of its rise (the mean loss rose)" and _share_text(0.5) == "50.0%"


def test_reconstruct_says_a_share_of_a_rising_mean_loss_is_of_a_rise(rising_store, capsys):
    assert main(["reconstruct", rising_store.url, "--boot", "0"]) == 0
    out = capsys.readouterr().out
    assert "loss rise (the mean loss rose) carried by events" in out and "loss drop carried" not in out
