"""The report of a store as a researcher ends up with it: several T runs (seeds named seed2 and
seed10, one fitted with other thresholds, one still being recorded after its fit, one never
fitted) on a probe of many domains."""

from __future__ import annotations

import numpy as np
import pytest

import tokdyn
from tokdyn import report
from tokdyn.analysis import LeftOutWarning, analyze_store
from tokdyn.fit.job import fit_run
from tokdyn.fit.options import FitOptions

N, SEQ, DOMAINS = 1200, 50, 12
STEPS = np.unique(np.geomspace(1, 1e4, 16).astype(int))


def planted(seed: int, domain_drop: np.ndarray, domain: np.ndarray) -> np.ndarray:
    """[steps, N] losses: one sigmoid per token in log10 step, its drop set by its domain."""
    rng = np.random.default_rng(seed)
    x = np.log10(STEPS)
    mu, s = rng.uniform(1, 3, N), rng.uniform(0.05, 0.2, N)
    d = domain_drop[domain] * rng.uniform(0.8, 1.2, N)
    Y = 1 + d[None, :] / (1 + np.exp((x[:, None] - mu[None, :]) / s[None, :]))
    return (Y + rng.normal(0, 0.03, Y.shape)).clip(0.01)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    domain = ((np.arange(N) // SEQ) % DOMAINS).astype(np.int32)
    ta = {"sample_id": (np.arange(N) // SEQ).astype(np.int32), "token_pos": (np.arange(N) % SEQ + 1).astype(np.int32),
          "token_id": np.random.default_rng(0).integers(0, 40, N).astype(np.int32), "domain": domain}  # fmt: skip
    probe = tokdyn.ProbeSet(None, ta, domains=tuple(f"dom{i}" for i in range(DOMAINS)))
    st = tokdyn.open_store(tmp_path_factory.mktemp("h13") / "s.zarr", probe, mode="w")
    falling, middle = np.linspace(3, 0.6, DOMAINS), 3 - 0.4 * np.abs(np.arange(DOMAINS) - 5)
    plans = {"seed10": middle, "seed2": falling, "opts": falling, "rec": falling, "unfit": falling}
    for i, (name, drops) in enumerate(plans.items()):
        Y = planted(i, drops, domain)
        w = st.create_run(name, capacity=len(STEPS) + 2).writer()
        for k, step in enumerate(STEPS):
            w.append(Y[k], step=int(step))
        if name == "unfit":
            continue
        options = FitOptions(delta_min=1.0, two_step=False) if name == "opts" else FitOptions(two_step=False)
        fit_run(st.run(name), options=options, progress=False)
        if name == "rec":  # still being recorded: two rows after its fit
            for step in (20_000, 40_000):
                w.append(Y[-1], step=step)
    return tokdyn.open_store(st.url)


@pytest.fixture(scope="module")
def analysis(store):
    return analyze_store(store, n_boot=0)


def test_runs_come_in_the_order_of_the_numbers_in_their_names(store, analysis):
    # the store lists seed10 before seed2 (code point order); a report of 12 seeds read
    # seed0, seed1, seed10, seed11, seed2, ...
    names = [a.run for a in analysis.runs]
    assert names.index("seed2") < names.index("seed10")
    meta = report._metadata_tables(store, analysis)
    assert meta.index(">seed2<") < meta.index(">seed10<")


def test_a_run_whose_fit_is_out_of_date_is_not_called_unfitted(store, analysis):
    # 'rec' was fitted, then recorded on: the report said "Not fitted (left out): rec, unfit"
    assert analysis.not_fitted == ["unfit"]
    assert f"made on {len(STEPS)} rows; the run now has {len(STEPS) + 2}" in analysis.failed["rec"]
    text = report._scores_table(analysis)
    assert "Not fitted (left out): unfit<" in text
    assert f"Left out, rec: the fit of run &#x27;rec&#x27; was made on {len(STEPS)} rows" in text


def test_each_run_s_classes_are_explained_with_its_own_thresholds(store, analysis):
    # 'opts' was fitted with delta_min 1.0; the table gave every run's classes the first run's 0.5
    text = report._classes_help(store, analysis)
    assert "the loss falls clearly, by 1.0 nats or more" in text
    assert "the loss falls clearly, by 0.5 nats or more" in text
    assert "Run opts (fitted with these thresholds)" in text
    assert "Runs seed2, seed10 (fitted with these thresholds)" in text


def test_one_store_fitted_alike_keeps_a_single_table(store):
    an = analyze_store(store, runs=["seed2", "seed10"], n_boot=0)
    text = report._classes_help(store, an)
    assert text.count("<table>") == 1 and "fitted with these thresholds" not in text


def _legend_colours(fig, panel: int) -> dict[str, tuple]:
    import matplotlib.colors as mcolors

    leg = fig.axes[panel].get_legend()
    return {t.get_text(): mcolors.to_rgba(h.get_color()) for t, h in zip(leg.get_texts(), leg.legend_handles)}


def test_a_domain_has_one_colour_in_every_run_s_figure(store, analysis):
    # the domain panel coloured its curves by rank: dom5 carries seed10's largest drop and the
    # sixth of seed2's, so it was blue in one run's figure and brown in the other's
    import matplotlib.pyplot as plt

    by = {a.run: a for a in analysis.runs}
    figs = {n: report._fig_groups(store, by[n]).fig for n in ("seed2", "seed10")}
    domains = {n: _legend_colours(f, 1) for n, f in figs.items()}
    bands = {n: _legend_colours(f, 2) for n, f in figs.items()}
    for f in figs.values():
        plt.close(f)
    shared = set(domains["seed2"]) & set(domains["seed10"])
    assert shared and set(domains["seed2"]) != set(domains["seed10"])  # some domains in both, at other ranks
    assert len(set(domains["seed2"].values())) == len(domains["seed2"])  # distinct within a panel
    every = {**domains["seed2"], **domains["seed10"]}
    for n in ("seed2", "seed10"):
        assert all(every[label] == c for label, c in domains[n].items())
        assert bands[n] == bands["seed2"]


def _overlapping_labels(ax) -> list[tuple[str, str]]:
    ax.figure.canvas.draw()
    r = ax.figure.canvas.get_renderer()
    labels = [(t.get_text(), t.get_window_extent(r)) for t in ax.get_xticklabels() if t.get_text() and t.get_visible()]
    x0, x1 = ax.get_xlim()
    labels = [(s, b) for (s, b), v in zip(labels, [t.get_position()[0] for t in ax.get_xticklabels() if t.get_text()])
              if x0 <= v <= x1]  # fmt: skip
    return [(a, b) for (a, ba), (b, bb) in zip(labels, labels[1:]) if ba.x1 > bb.x0]


@pytest.mark.parametrize("ncols,hi", [(4, 6.0), (4, 4.0), (3, 5.0), (2, 6.0), (4, 1.3), (4, 0.6)])
def test_log_tick_labels_of_narrow_panels_do_not_overlap(ncols, hi):
    # four panels across the page over steps 1 to 1e6 printed "1001,00010,000" (the spectrum by
    # group, the example tokens of a run recorded to step 1e6)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(2.9 * ncols + 1, 4.4), layout="constrained")
    for ax in axes:
        x = np.linspace(0, hi, 50)
        ax.plot(x, x)
        report._axis_x(ax, "T", x)
    try:
        assert _overlapping_labels(axes[0]) == []
        shown = [t.get_text() for t in axes[0].get_xticklabels() if t.get_text()]
        assert len(shown) >= 2
    finally:
        plt.close(fig)


def test_a_run_left_out_is_said_by_a_warning_and_by_the_command(store, tmp_path, capsys):
    """`tokdyn report` wrote a report without the out-of-date run 'rec', exit 0 and not a word:
    only the page said it, at its end."""
    from reliability_fixtures import run_cli

    with pytest.warns(LeftOutWarning) as got:
        left = analyze_store(store, n_boot=0).failed
    said = [str(w.message) for w in got if issubclass(w.category, LeftOutWarning)]
    assert list(left) == ["rec"] and said == [f"left out of the analysis: {left['rec']}"], said
    assert said[0].startswith("left out of the analysis: the fit of run 'rec' was made on")
    code, err = run_cli(["report", store.url, "--out", str(tmp_path / "r.html")], capsys)
    lines = err.strip().splitlines()
    assert code == 0 and (tmp_path / "r.html").exists()
    assert lines == [f"tokdyn report: warning: {said[0]}"], lines  # one line, the run and why
