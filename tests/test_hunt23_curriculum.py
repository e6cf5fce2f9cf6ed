"""The curriculum from pilot to the next run's data, as a researcher whose data is not the demo's
feeds it (hunt 23): domains each held in one document, invariances of the schedule under a
reordering of the domains, and what the A/B read-out says about its own intervals."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokdyn
from test_curriculum_pilot_checks import BYTE, STEPS
from tokdyn.curriculum.mixture import DomainRates, MixtureConfig, MixtureSchedule, enrichment_verdict, pilot_events
from tokdyn.errors import InputError
from tokdyn.spectrum import Events


def _one_document_a_domain(path, *, seed: int = 0) -> str:
    """A fitted pilot of two domains, each one document of 30 windows of one target; every token
    learned at a time drawn from one distribution (2 .. 3.5), so the domains differ by noise only."""
    rng = np.random.default_rng(100 + seed)
    mu = rng.uniform(2, 3.5, 60)
    dom = np.repeat([0, 1], 30)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(97, 123, size=(60, 2)), domain=dom, doc_id=dom, domains=("a", "b"),
                                        tokenizer=BYTE)  # fmt: skip
    x = np.log10(STEPS)
    store = tokdyn.open_store(path, probe, mode="w")
    with store.create_run("pilot", capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            w.append((1 + 3 / (1 + np.exp((x[j] - mu) / 0.1)) + 0.05 * rng.standard_normal(60)).astype(np.float32), step=int(step))
    tokdyn.fit_run(tokdyn.open_store(path, mode="r+").run("pilot"), progress=False)
    return str(path)


# -- a domain held in one document ---------------------------------------------------------


def test_domains_of_one_document_each_are_resampled_by_their_windows(tmp_path):
    """Resampling documents, a domain that is one document draws the same rate in every
    resample: its error read 0, nothing was shrunk, and two domains drawn alike got a schedule
    of 0.85 / 0.15 with "+1.4 % more learnable-now loss drop" (best 1.086). Such a domain is
    resampled by its windows, and the same noise is said to be noise."""
    pe = pilot_events(_one_document_a_domain(tmp_path / "p.zarr"), "pilot")
    rates = DomainRates.from_events(pe.events, pe.token_domain, pe.domains)
    assert rates.noise["n_units"] == 60 and rates.noise["resampled"] == "windows"
    e = MixtureSchedule(rates, MixtureConfig(total_steps=3000)).enrichment()
    assert e["best"] < 1.05 <= e["best_unshrunk"]
    assert e["schedule"] == pytest.approx(1.0, abs=1e-3) and "at this size that is noise" in enrichment_verdict(e)


def _events(units_a: np.ndarray, units_b: np.ndarray, seed: int = 0) -> tuple[Events, np.ndarray]:
    """Events of two domains, one token each event, ``units_*`` the unit of each of its tokens."""
    rng = np.random.default_rng(seed)
    unit = np.concatenate([units_a, units_b + units_a.max() + 1])
    n = unit.size
    ev = Events(token=np.arange(n), mu=rng.uniform(0.5, 2.5, n), s=np.full(n, 0.15), delta=rng.uniform(0.5, 2, n),
                n_tokens=n, x_range=(0.0, 3.0))  # fmt: skip
    return replace(ev, unit=np.unique(unit, return_inverse=True)[1], unit_kind="document"), np.repeat([0, 1], [units_a.size, units_b.size])


def test_a_domain_whose_noise_no_resample_can_show_is_refused():
    """Events of hand-made units where domain 'b' is one document: its error cannot be told, and
    read as 0 its whole difference from 'a' passed as real. One line names it; significance=0
    (the raw rates, nothing shrunk) still takes them."""
    ev, dom = _events(np.arange(20) // 2, np.zeros(20, int))
    with pytest.raises(InputError, match=r"domain\(s\) \['b'\] have their scored probe tokens in one document"):
        DomainRates.from_events(ev, dom, ("a", "b"))
    assert DomainRates.from_events(ev, dom, ("a", "b"), significance=0).noise is None


# -- invariances --------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(perm=st.permutations(range(3)), seed=st.integers(0, 2**16))
def test_reordering_the_domains_reorders_rates_and_weights_with_their_names(perm, seed):
    """The domains' order is a labelling: relabel every token's domain by a permutation, and each
    domain's raw and shrunk rates, weights and the enrichment are those it had (by name)."""
    rng = np.random.default_rng(seed)
    n = 90
    unit = np.arange(n) // 3
    ev = replace(Events(token=np.arange(n), mu=rng.uniform(0.5, 2.5, n), s=np.full(n, 0.2), delta=rng.uniform(0.1, 2, n),
                        n_tokens=n, x_range=(0.0, 3.0)), unit=unit, unit_kind="document")  # fmt: skip
    dom = rng.permutation(np.arange(n) % 3)
    names = ("code", "prose", "certs")
    new = np.asarray(perm)  # domain k becomes domain new[k]
    renamed = [None] * 3
    for k, name in enumerate(names):
        renamed[new[k]] = name
    cfg = MixtureConfig(total_steps=500, floor=0.2)
    a, b = DomainRates.from_events(ev, dom, names), DomainRates.from_events(ev, new[dom], renamed)
    np.testing.assert_allclose(b.rates[:, new], a.rates, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(b.unshrunk.rates[:, new], a.unshrunk.rates, rtol=1e-12, atol=1e-15)
    sa, sb = MixtureSchedule(a, cfg), MixtureSchedule(b, cfg)
    np.testing.assert_allclose(sb.table_[:, new], sa.table_, rtol=1e-12, atol=1e-15)
    assert sb.enrichment()["schedule"] == pytest.approx(sa.enrichment()["schedule"], rel=1e-12)



@settings(max_examples=10, deadline=None)
@given(copies=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_a_probe_copied_within_its_documents_keeps_its_rates(copies, seed):
    """Every token of the probe repeated ``copies`` times in its own document says nothing new:
    the rates per token, their resampled errors (a document's copies are drawn together) and
    hence the shrunk rates are the same."""
    rng = np.random.default_rng(seed)
    n = 60
    unit, mu, delta = np.arange(n) // 3, rng.uniform(0.5, 2.5, n), rng.uniform(0.1, 2, n)
    dom = rng.permutation(np.arange(n) % 2)

    def events(k):
        m = n * k
        ev = Events(token=np.arange(m), mu=np.tile(mu, k), s=np.full(m, 0.2), delta=np.tile(delta, k), n_tokens=m,
                    x_range=(0.0, 3.0))  # fmt: skip
        return replace(ev, unit=np.tile(unit, k), unit_kind="document"), np.tile(dom, k)

    one, many = (DomainRates.from_events(*events(k), ("a", "b")) for k in (1, copies))
    np.testing.assert_allclose(many.unshrunk.rates, one.unshrunk.rates, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(many.rates, one.rates, rtol=1e-9, atol=1e-12)


# -- the A/B read-out ---------------------------------------------------------------------


def _ab_runs(cfg, ladders: dict, ends: dict) -> list[dict]:
    """Runs of the ladder ``ladders[seed]`` (one loss per rung) and a ``mixture`` arm ending at
    ``ends[seed]``; both domains at the mixture's loss."""
    curve = [[3.0, 3.1]] * cfg.eval_points
    runs = []
    for s in cfg.seeds:
        for b, loss in zip(cfg.ladder, ladders[s]):
            runs.append({"seed": s, "arm": "base", "budget": b, "final_mixture": loss, "final": [loss, loss], "curve": curve,
                         "draws_sha256": "x"})  # fmt: skip
        runs.append({"seed": s, "arm": "mixture", "budget": 1.0, "final_mixture": ends[s], "final": [ends[s]] * 2,
                     "curve": curve, "draws_sha256": "y"})  # fmt: skip
    return runs


def test_a_seed_whose_ladder_cannot_be_read_is_named_not_called_outside_it():
    """Seed 3's 0.9x rung ended above its 0.8x one (noise at a small size), and its arm, worse
    than both, has no budget to read there: its speed-up was NaN, left out of the mean, and the
    line called it "outside the ladder", as if it had a figure; the seed left out is the one on
    which the arm did worst, so the mean read better than the runs. It is named as left out."""
    from tokdyn.curriculum.ab import MixtureABConfig, headline_lines, summarize_runs

    cfg = MixtureABConfig(seeds=(0, 1, 2, 3), arms=("mixture",), ladder=(0.8, 0.9, 1.0), steps=40, eval_points=4)
    ladders = {s: (3.3, 3.2, 3.1) for s in (0, 1, 2)} | {3: (3.2, 3.25, 3.1)}
    res = summarize_runs(_ab_runs(cfg, ladders, {0: 3.15, 1: 3.16, 2: 3.14, 3: 3.3}), cfg, ("a", "b"))
    c = res["comparison"]["mixture"]
    assert c["speedup"]["n"] == 3 and c["speedup"]["n_left_out"] == 1
    assert c["outside_ladder"] == [] and c["unreadable"] == [3]
    res.update(enrichment_verdict="-", aa_batches_identical={"identical": True})
    line = [x for x in headline_lines(res) if x.startswith("mixture")][0]
    assert line.endswith("n=3; the ladder has no budget for the arm's loss (a rung no lower than the one below it) on "
                         "seeds [3], left out"), line


@pytest.mark.parametrize("n_seeds", [1, 2])
def test_the_positive_control_of_one_seed_claims_no_interval(n_seeds):
    """From one seed the control has no interval: the line printed "(95% CI +nan% .. +nan%) -> NOT
    detected: the interval reaches 0" of an interval that does not exist; it says there is none.
    From two seeds it is read as before."""
    from tokdyn.curriculum.ab import MixtureABConfig, headline_lines, summarize_runs

    seeds = tuple(range(n_seeds))
    cfg = MixtureABConfig(seeds=seeds, arms=("mixture",), ladder=(0.8, 0.9, 1.0), steps=40, eval_points=4)
    lad = lambda b, s: 3.0 - 0.4 * np.log(b) + 0.001 * s  # noqa: E731  (linear in log budget: the control reads -11.1 %)
    res = summarize_runs(_ab_runs(cfg, {s: [lad(b, s) for b in cfg.ladder] for s in seeds}, {s: 3.0 for s in seeds}), cfg,
                         ("a", "b"))  # fmt: skip
    res.update(enrichment_verdict="-", aa_batches_identical={"identical": True})
    line = [x for x in headline_lines(res) if x.startswith("positive control")][0]
    assert res["positive_control"]["speedup"]["mean"] == pytest.approx(1 - 1 / 0.9)
    if n_seeds == 1:
        assert "nan" not in line and "interval reaches 0" not in line and "no interval from one seed" in line, line
        assert not res["positive_control"]["detected"]
    else:
        assert line.endswith("-> detected"), line


# -- domain names as the lines show them --------------------------------------------------


def test_names_that_show_nothing_at_their_edges_are_quoted():
    """An empty name, one of spaces, one with a space at an end or a comma (the lines' separators)
    showed as nothing or as two names: a schedule of domains '' and ' ' printed
    "step 1:  0.50,   0.50", and 'code' beside 'code ' as "code 0.50, code  0.50"."""
    from tokdyn._text import labels

    assert labels(["", " "]) == ["''", "' '"]
    assert labels(["code", "code ", "\tx"]) == ["code", "'code '", "\\tx"]  # a tab shows as its escape
    assert labels(["a, b", "c"]) == ["'a, b'", "c"]
    assert labels(["code", "prose text", "caf\u00e9"]) == ["code", "prose text", "caf\u00e9"]  # shown as before


def test_a_schedule_of_domains_named_by_spaces_tells_them_apart(tmp_path, capsys):
    from test_hunt18_curriculum import _pilot

    from tokdyn.cli import main

    rng = np.random.default_rng(1)
    store = _pilot(tmp_path / "p.zarr", rng.uniform(2.0, 3.0, 40), rng.uniform(3.0, 4.0, 40), domains=("", " "))
    assert main(["curriculum", "schedule", store, "--run", "pilot", "--steps", "1000", "--out", str(tmp_path / "m.json")]) == 0
    step = next(line for line in capsys.readouterr().out.splitlines() if "step   1000" in line)
    assert step.startswith("  step   1000: '' 0.") and ", ' ' 0." in step, step


# -- a schedule file as its reader takes it -------------------------------------------------


@pytest.mark.parametrize("weights", [[], [[0.5, 0.5]] * 3, "x"])
def test_a_schedule_file_claiming_more_steps_than_it_holds_is_refused_before_any_work(tmp_path, monkeypatch, weights):
    """A 35 kB file whose config says 10,000,000 steps and whose weights hold none made the reader
    compute every step's weights (12 s and 1.4 GB for two domains, more with more domains) before
    it found that they were not the file's. The file's rows are counted first: the work is
    bounded by what the file holds."""
    import json

    from tokdyn.curriculum import mixture

    rates = DomainRates(["a", "b"], np.array([0.0, 3.0]), np.array([[1.0, 0.0], [0.0, 1.0]]))
    path = MixtureSchedule(rates, MixtureConfig(total_steps=3)).save(tmp_path / "m.json")
    d = json.loads(open(path).read())
    d["config"]["total_steps"] = mixture.MAX_MIXTURE_STEPS
    d["weights"] = weights
    (tmp_path / "big.json").write_text(json.dumps(d))

    def never(self, r):
        raise AssertionError("the schedule's weights were computed for a file that does not hold them")

    monkeypatch.setattr(mixture.MixtureSchedule, "_weights", never)
    with pytest.raises(InputError, match=r"big.json: .*weights"):
        mixture.load_mixture_schedule(tmp_path / "big.json")


# -- what a schedule hands out --------------------------------------------------------------


def test_probabilities_handed_out_do_not_change_the_schedule_or_its_sampler():
    """``SampleSchedule.probabilities(step)`` handed out the array it caches: a loop that zeroed a
    sample or rescaled the row it was given changed what the schedule, and the sampler drawing
    from it at that step, gave next (the mixture's weights were fixed so in hunt 20)."""
    from test_curriculum import HAND, V, _table

    from tokdyn.curriculum import CurriculumConfig, CurriculumSampler, SampleSchedule

    windows = np.random.default_rng(2).integers(0, 5, size=(40, 6))
    sched = SampleSchedule(_table(HAND), windows, CurriculumConfig(total_steps=100, floor=0.2), tokenizer=V)
    fresh = SampleSchedule(_table(HAND), windows, CurriculumConfig(total_steps=100, floor=0.2), tokenizer=V)
    sampler = CurriculumSampler(sched, samples_per_step=64, seed=0)
    want = CurriculumSampler(fresh, samples_per_step=64, seed=0).draws(7)
    p = sched.probabilities(7)
    p[:20] = 0.0
    p /= p.sum()
    np.testing.assert_array_equal(sched.probabilities(7), fresh.probabilities(7))
    np.testing.assert_array_equal(sampler.draws(7), want)


def test_an_enrichment_handed_out_does_not_change_the_schedule(tmp_path):
    """``enrichment()`` shared its noise record and its list of unfed domains with the schedule:
    editing the answer changed what ``save`` wrote."""
    import json

    from test_curriculum_v2 import _copied_domains

    ev, dom = _copied_domains(0)
    sched = MixtureSchedule(DomainRates.from_events(ev, dom, ("a", "b")), MixtureConfig(total_steps=10), base=[1.0, 0.0])
    e = sched.enrichment()
    e["noise"]["n_units"] = 1
    e["zero_base"].append("x")
    saved = json.loads(open(sched.save(tmp_path / "m.json")).read())["enrichment"]
    assert saved["noise"]["n_units"] == 16 and saved["zero_base"] == ["b"]
    assert sched.enrichment()["noise"]["n_units"] == 16 and sched.enrichment()["zero_base"] == ["b"]


def test_a_v1_arm_that_diverged_after_reaching_the_target_is_no_speed_up():
    """The v1 read-out skipped an arm's NaN evaluations, so an arm that reached the baseline's
    final loss at step 15 and then diverged (NaN at the end) read +50 %, unflagged; and one
    diverged seed (its NaN speed-up) made every seed's mean and interval NaN. A seed whose arm or
    baseline ended not finite is named (``diverged``) and left out of the mean, counted, as in
    the mixture measurement."""
    from tokdyn.curriculum.experiment import compare_curves, summarize

    steps = [10, 20, 30]
    base = {s: {"steps": steps, "val_loss": [3.0, 2.5, 2.0]} for s in range(3)}
    arm = {0: {"steps": steps, "val_loss": [3.0, 2.0, 1.9]}, 1: {"steps": steps, "val_loss": [3.0, 1.0, float("nan")]},
           2: {"steps": steps, "val_loss": [2.9, 2.0, 1.8]}}  # fmt: skip
    c = compare_curves(base, arm)
    assert c["diverged"] == [1] and np.isnan(c["per_seed"]["speedup"][1]) and np.isnan(c["per_seed"]["auc_ratio"][1])
    assert c["speedup"]["n"] == 2 and c["speedup"]["n_left_out"] == 1
    assert c["speedup"]["mean"] == pytest.approx(1 - 20 / 30)  # seeds 0 and 2 both reach 2.0 at step 20
    got, want = summarize([0.1, float("nan"), 0.3]), summarize([0.1, 0.3])
    assert got["n_left_out"] == 1 and want["n_left_out"] == 0
    assert {k: got[k] for k in ("mean", "sd", "ci95", "n")} == {k: want[k] for k in ("mean", "sd", "ci95", "n")}
    assert want["mean"] == pytest.approx(0.2) and want["n"] == 2


def test_a_probe_naming_a_domain_it_has_no_token_of_says_which(tmp_path, capsys):
    """A probe labelled with domains 'a' and 'b' whose tokens are all of 'a' (b was in the
    training data, not in the probe) was told it "holds one domain (a); a mixture schedule needs
    a probe of two or more labelled domains", which it is; the line names 'b' as the domain with
    no probe tokens, as the library says."""
    from test_hunt20_curriculum import _pilot

    from reliability_fixtures import cli_error_line, run_cli

    mu = np.random.default_rng(0).uniform(2, 3, 40)
    store = _pilot(tmp_path / "p.zarr", mu, np.zeros(40, int), ("a", "b"), np.zeros(40, bool))
    code, err = run_cli(["curriculum", "schedule", store, "--run", "pilot", "--steps", "100", "--out", str(tmp_path / "m.json")],
                        capsys)  # fmt: skip
    line = cli_error_line(err)
    assert code == 1 and "domain(s) ['b'] have no probe tokens" in line, line


def test_the_v1_line_of_one_seed_claims_no_interval():
    """From one seed (or one left after a diverged one) the v1 line printed "(95% CI +nan% ..
    +nan%; ...)" and "AUC ratio ... (nan .. nan)"; it says that one seed gives no interval."""
    from tokdyn.curriculum.experiment import arm_line, compare_curves

    steps = [10, 20, 30]
    one = compare_curves({0: {"steps": steps, "val_loss": [3.0, 2.5, 2.0]}}, {0: {"steps": steps, "val_loss": [3.0, 2.0, 1.9]}})
    line = arm_line("sample", one)
    assert "nan" not in line and "no interval from one seed" in line and "+33.3%" in line, line
    two = compare_curves({s: {"steps": steps, "val_loss": [3.0, 2.5, 2.0]} for s in (0, 1)},
                         {s: {"steps": steps, "val_loss": [3.0, 2.0, 1.9 - s]} for s in (0, 1)})  # fmt: skip
    assert "(95% CI +33.3% .. +33.3%; per seed +33.3%, +33.3%)" in arm_line("sample", two)


def test_a_positive_control_seed_with_no_budget_to_read_is_said():
    """Seed 2's full baseline ended above its 0.8x one: its control has no budget to read and
    was left out of the control's mean and interval with nothing said; the line says so."""
    from tokdyn.curriculum.ab import MixtureABConfig, headline_lines, summarize_runs

    cfg = MixtureABConfig(seeds=(0, 1, 2), arms=("mixture",), ladder=(0.8, 0.9, 1.0), steps=40, eval_points=4)
    lad = lambda b, s: 3.0 - 0.4 * np.log(b) + 0.001 * s  # noqa: E731
    ladders = {s: [lad(b, s) for b in cfg.ladder] for s in (0, 1)} | {2: (3.2, 3.25, 3.3)}
    res = summarize_runs(_ab_runs(cfg, ladders, {0: 3.0, 1: 3.0, 2: 3.1}), cfg, ("a", "b"))
    assert res["positive_control"]["speedup"]["n"] == 2 and res["positive_control"]["speedup"]["n_left_out"] == 1
    res.update(enrichment_verdict="-", aa_batches_identical={"identical": True})
    line = [x for x in headline_lines(res) if x.startswith("positive control")][0]
    assert line.endswith("; no budget to read on seeds [2], left out"), line
