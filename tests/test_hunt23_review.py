"""Review of hunt 23 (2161ec2..65a8c56): regressions and inconsistencies the branches left."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest


def test_one_report_counts_the_tokens_with_no_recorded_loss_once(tmp_path):
    """e6ccece made never_scored (no point, not set aside) the rule of the class figure's caption
    and RunAnalysis.summary's n_unscored, but the loss figure's caption still counts by
    fit_scored (n_points == 0, set-aside tokens included): one report says "5 probe tokens with
    no recorded loss" under one figure and "8 ... with no recorded loss" under another, and the
    3 set-aside tokens had losses (below 0)."""
    from test_hunt22_invariances import make_store, planted_all_classes

    from tokdyn.analysis import analyze_run
    from tokdyn.fit import fit_run
    from tokdyn.report import _n_unscored, _scored_class_counts

    Y = planted_all_classes(seed=4, n_each=3)  # 5 padding tokens
    Y[:3] = -Y[:3]  # 3 tokens set aside for their losses (unfit, not padding)
    store = make_store(tmp_path / "s.zarr", Y)
    fit_run(store.run("r"), scheduler="sync", backend="numpy", progress=False)
    a = analyze_run(store.run("r"), n_boot=0, groups=False)
    assert a.summary()["n_unscored"] == 5
    assert "5 probe tokens with no recorded loss" in _scored_class_counts(a)[1]
    assert _n_unscored(a) == (a.summary()["n_unscored"], 3)  # was 8: the set-aside tokens said as with no loss
    from tokdyn.report import _fig_reconstruction

    cap = _fig_reconstruction(store, a).caption  # the mean's tokens and those left out add up to the probe's
    assert "5 probe tokens with no recorded loss and 3 tokens set aside for their losses (class unfit) left out" in cap, cap
    kept = re.search(r"(?:all|the same) ([\d,]+) probe tokens", cap)
    some = re.search(r"([\d,]+) tokens? that miss a loss at some", cap)
    assert int(kept[1]) + (int(some[1]) if some else 0) + 5 + 3 == len(Y), cap


def test_the_positive_control_from_one_readable_seed_names_those_left_out():
    """6b36210 names a control seed with no budget to read ("no budget to read on seeds [..],
    left out"), but only when two or more seeds remain: from 3 seeds of which 2 are unreadable the
    line says "n=1 (no interval from one seed ...)" and names neither, as the arms' line does
    (_diverged_note is added in their n < 2 branch too)."""
    from tokdyn.curriculum.ab import headline_lines

    res = {"enrichment_verdict": "-", "comparison": {}, "aa": None,
           "positive_control": {"expected": 1 - 1 / 0.9, "detected": False, "unreadable": [1, 2],
                                "per_seed": [math.nan, -0.1, math.nan],
                                "speedup": {"mean": -0.1, "ci95": [math.nan, math.nan], "n": 1, "n_left_out": 2}}}  # fmt: skip
    line = [x for x in headline_lines(res) if x.startswith("positive control")][0]
    assert "[1, 2]" in line, line


def test_a_count_check_of_a_huge_negative_int_is_one_input_error():
    """_checks.check_count writes the value by repr, not by _text.shown (moved to be shared in
    b312692 for this): an int of more than 4300 digits has no repr, so capacity=-10**5000 was
    Python's ValueError (an "internal error" line), not the InputError naming capacity."""
    from tokdyn._checks import check_count
    from tokdyn.errors import InputError

    with pytest.raises(InputError, match=r"^capacity must be an integer >= 1, got a negative int of about 5001 digits$"):
        check_count("capacity", -(10**5000))
    with pytest.raises(InputError, match=r"^batch must be an integer >= 1, got 2\.5$"):
        check_count("batch", np.float64(2.5))


def test_the_observed_range_a_token_times_refusal_prints_is_taken():
    """fc7a06b's refusal printed the observed range by .6g (4.50515..5.80618 for budgets 32000 ..
    640000): given back as the x_range the line asks for, it was refused, since 5.80618 lies past
    log10(640000) = 5.806179973983887 (and a rounded-down lower end before the first)."""
    from tokdyn.compare import _inside
    from tokdyn.errors import InputError

    observed = (math.log10(32000), math.log10(640000))
    with pytest.raises(InputError) as got:
        _inside((5.0, 9.0), observed, "A")
    printed = str(got.value).split("observed (")[1].split(")")[0].split("..")
    assert _inside(tuple(float(v) for v in printed), observed, "A") == observed


def test_a_control_seed_whose_ladder_diverged_is_not_called_unreadable():
    """A seed whose 0.9x baseline ended at NaN is "diverged" in the arms' line and, in the same
    headline, "no budget to read" in the control's (6b36210 took every NaN control as a rung no
    lower than the one below it)."""
    from test_hunt23_curriculum import _ab_runs

    from tokdyn.curriculum.ab import MixtureABConfig, headline_lines, summarize_runs

    cfg = MixtureABConfig(seeds=(0, 1, 2), arms=("mixture",), ladder=(0.8, 0.9, 1.0), steps=40, eval_points=4)
    lad = lambda b, s: 3.0 - 0.4 * np.log(b) + 0.001 * s  # noqa: E731
    ladders = {s: [lad(b, s) for b in cfg.ladder] for s in (0, 1)} | {2: (3.2, float("nan"), 3.0)}
    res = summarize_runs(_ab_runs(cfg, ladders, {0: 3.0, 1: 3.0, 2: 3.0}), cfg, ("a", "b"))
    assert res["comparison"]["mixture"]["diverged"] == [2]
    assert res["positive_control"]["unreadable"] == [] and res["positive_control"]["diverged"] == [2]
    res.update(enrichment_verdict="-", aa_batches_identical={"identical": True})
    line = [x for x in headline_lines(res) if x.startswith("positive control")][0]
    assert "no budget to read" not in line and "diverged" in line, line


def test_a_v1_seed_with_no_speed_up_to_read_is_named_in_its_line():
    """cf17008 made summarize leave out a NaN speed-up: a seed whose baseline reached its final
    loss at step 0 (speed-up NaN, not diverged) made the mean "+nan%" before; now it drops out of
    the mean and interval (n_left_out 1) and arm_line names no seed left out ("+50.0% (95% CI
    +50.0% .. +50.0%; per seed +50.0%, +nan%, +50.0%)"), what bacae18 fixed for the mixture A/B."""
    from tokdyn.curriculum.experiment import arm_line, compare_curves

    steps = [0, 10, 20]
    base = {s: {"steps": steps, "val_loss": [2.0, 2.5, 2.0] if s == 1 else [3.0, 2.5, 2.0]} for s in range(3)}
    c = compare_curves(base, {s: {"steps": steps, "val_loss": [3.0, 2.0, 1.9]} for s in range(3)})
    assert c["speedup"]["n"] == 2 and c["speedup"]["n_left_out"] == 1 and c["diverged"] == []
    assert "left out" in arm_line("sample", c) and "[1]" in arm_line("sample", c), arm_line("sample", c)
