"""Curriculum v2: domains, coupled sampling, mixture schedule, enrichment, budget ladder.

Every check compares against an independent answer: bit-identical A/A draws, hand-computed
enrichment and weights, planted ladders and planted learning events.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokdyn.corpus import Document, relabel_documents, stdlib_mixture_documents
from tokdyn.curriculum.coupled import CoupledSampler, domain_probabilities
from tokdyn.curriculum.measure import matched_budget, paired_bootstrap, speedup
from tokdyn.curriculum.mixture import (ContextSchedule, DomainRates, MixtureConfig, MixtureSchedule, enrichment_verdict,
                                       load_mixture_schedule, mixture_sampler)  # fmt: skip
from tokdyn.data import DomainCorpus, MixtureDataset, prepare_domains, split_by_domain
from tokdyn.tokenizer import ByteTokenizer
from tokdyn.errors import InputError
from tokdyn.spectrum import Events

ROOT = Path(__file__).resolve().parents[1]


def _flat_rates(values, domains=("a", "b")) -> DomainRates:
    x = np.linspace(-1, 4, 11)
    return DomainRates(domains, x, np.tile(np.asarray(values, float), (x.size, 1)))


# -- coupled sampling --------------------------------------------------------------------


def test_aa_arm_draws_are_bit_identical_to_the_baseline():
    ids = np.repeat([0, 1, 2], [50, 7, 300])
    base = domain_probabilities(ids, [1 / 3, 1 / 3, 1 / 3])
    flat = MixtureSchedule(_flat_rates([1.0, 5.0, 0.0], ("a", "b", "c")), MixtureConfig(total_steps=40, floor=1.0))
    a = CoupledSampler(base, samples_per_step=16, total_steps=40, seed=3)
    b = CoupledSampler(base, lambda s: domain_probabilities(ids, flat.weights(s)), samples_per_step=16, total_steps=40, seed=3)
    for t in range(40):
        idx, kept = b.kept(t)
        assert np.array_equal(idx, a.draws(t)) and kept.all()
    assert list(a) == list(b)


def test_coupled_draws_follow_the_arm_distribution_and_keep_one_minus_tv():
    n = 6
    base = np.full(n, 1 / n)
    p = np.array([0.4, 0.3, 0.1, 0.1, 0.1, 0.0])
    s = CoupledSampler(base, lambda t: p, samples_per_step=500, total_steps=200, seed=0)
    counts, kept = np.zeros(n), 0
    for t in range(200):
        idx, k = s.kept(t)
        counts += np.bincount(idx, minlength=n)
        kept += k.sum()
    freq = counts / counts.sum()
    assert np.abs(freq - p).max() < 0.006  # 100k draws: standard error <= 0.0016
    tv = 0.5 * np.abs(p - base).sum()
    assert kept / 100_000 == pytest.approx(1 - tv, abs=0.006)


def test_domain_probabilities_hand_computed():
    p = domain_probabilities(np.array([0, 0, 1, 1, 1, 1]), [0.5, 0.5])
    assert np.allclose(p, [0.25, 0.25, 0.125, 0.125, 0.125, 0.125])
    with pytest.raises(InputError, match="sum to 1"):
        domain_probabilities(np.array([0, 1]), [0.5, 0.6])


# -- mixture schedule and enrichment ------------------------------------------------------


def test_enrichment_hand_computed():
    sched = MixtureSchedule(_flat_rates([2.0, 0.0]), MixtureConfig(total_steps=10, floor=0.5))
    # q = b*r / sum = [1, 0]; w = 0.5*[.5,.5] + 0.5*[1,0] = [.75, .25]
    assert np.allclose(sched.weights(3), [0.75, 0.25])
    e = sched.enrichment()
    assert e["schedule"] == pytest.approx(0.75 * 2 / (0.5 * 2))  # 1.5
    assert e["best"] == pytest.approx(1.5) and e["unbounded"] == pytest.approx(2.0)
    assert "+50.0%" in enrichment_verdict(e)


def test_equal_rates_give_enrichment_one_and_the_tool_says_no_schedule_can_help():
    e = MixtureSchedule(_flat_rates([3.0, 3.0]), MixtureConfig(total_steps=20)).enrichment()
    assert e["schedule"] == pytest.approx(1.0) and e["best"] == pytest.approx(1.0)
    assert "no mixture schedule can help" in enrichment_verdict(e)


def test_planted_events_defer_the_late_domain_and_floor_the_stalled_one():
    # domain 0 learned at step ~3, domain 1 at step ~300, domain 2 never (no events)
    n = 30
    token = np.arange(20)
    mu = np.where(token < 10, 0.5, 2.5)
    ev = Events(token=token, mu=mu, s=np.full(20, 0.1), delta=np.full(20, 2.0), n_tokens=n, x_range=(0.0, 3.0))
    dom = np.repeat([0, 1, 2], 10)
    rates = DomainRates.from_events(ev, dom, ("early", "late", "stalled"), width=0.1)
    sched = MixtureSchedule(rates, MixtureConfig(total_steps=1000, floor=0.3))
    early, late = sched.weights(2), sched.weights(315)
    assert early[0] > 0.7 and late[1] > 0.7
    assert np.allclose([early[2], late[2]], 0.1)  # the floor: 0.3 * 1/3
    assert np.isclose(early.sum(), 1) and np.isclose(late.sum(), 1)
    assert sched.enrichment()["schedule"] > 1.5


def test_schedule_round_trips_and_drives_a_sampler(tmp_path):
    sched = MixtureSchedule(_flat_rates([2.0, 1.0]), MixtureConfig(total_steps=5, floor=0.2))
    back = load_mixture_schedule(sched.save(tmp_path / "m.json"))
    assert np.allclose(back.table_, sched.table_)
    s = mixture_sampler(np.array([1, 0, 0, 1]), back, samples_per_step=4)
    assert s.draws(0).shape == (4,) and s.n_samples == 4
    named = mixture_sampler(np.array([0, 1, 1, 0]), back, samples_per_step=4, domains=["b", "a"])  # ids index these names
    assert np.array_equal(named.base, s.base)
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "other"}))
    with pytest.raises(InputError, match="not a tokdyn mixture schedule"):
        load_mixture_schedule(tmp_path / "bad.json")


# -- budget ladder ------------------------------------------------------------------------


def test_planted_ladder_reads_back_budgets_and_the_positive_control():
    budgets = [0.8, 0.9, 1.0]
    loss = lambda b: 3.0 - 0.4 * math.log(b)  # noqa: E731  (linear in log budget)
    lad = [loss(b) for b in budgets]
    bstar, inside = matched_budget(budgets, lad, loss(0.95))
    assert bstar == pytest.approx(0.95) and inside
    # an arm that matches 1/0.9 of the budget saves 10 % of the steps (extrapolated, flagged)
    v, inside = speedup(budgets, lad, loss(1 / 0.9))
    assert v == pytest.approx(0.10) and not inside
    # the positive control: the 0.9x run read against the other rungs
    v, _ = speedup([0.8, 1.0], [loss(0.8), loss(1.0)], loss(0.9))
    assert v == pytest.approx(1 - 1 / 0.9)


def test_paired_bootstrap_of_constant_values_is_that_value():
    r = paired_bootstrap([0.1] * 10)
    assert r["mean"] == pytest.approx(0.1) and r["ci95"] == [pytest.approx(0.1), pytest.approx(0.1)]
    r = paired_bootstrap(np.arange(10.0))
    assert r["ci95"][0] < 4.5 < r["ci95"][1]


# -- data ---------------------------------------------------------------------------------


def test_split_by_domain_holds_out_every_domain_by_document():
    docs = [Document(key=f"{d}/{i}", domain=d, text="x" * 100) for d in "abc" for i in range(10)]
    docs.append(Document(key="solo", domain="solo", text="y" * 100))
    train, val = split_by_domain(docs, val_fraction=0.2)
    assert {d.domain for d in val} == {"a", "b", "c"}  # a one-document domain stays in training
    assert not {d.key for d in train} & {d.key for d in val}
    assert all(sum(d.domain == k for d in val) == 2 for k in "abc")
    assert split_by_domain(docs, val_fraction=0.2) == (train, val)


def _doc_ids(stream: np.ndarray, eot: int) -> np.ndarray:
    """Per token, the index of the document it belongs to (an end-of-text token ends its document)."""
    return np.concatenate([[0], np.cumsum(stream[:-1] == eot)])


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.lists(st.integers(1, 60), min_size=1, max_size=12), min_size=1, max_size=3),
       context=st.integers(2, 9), share=st.floats(0.05, 0.6))  # fmt: skip
def test_pilot_split_never_lets_the_pilot_see_a_held_out_document(lengths, context, share):
    """Whatever the document lengths: every target of a held-out window belongs to a document of
    which the pilot draws no token; domains keep their share; the probe comes from held windows."""
    from tokdyn.curriculum.pilot import split_pilot_pool

    eot = 99
    streams = [np.concatenate([np.concatenate([np.full(n, 7), [eot]]) for n in doc]).astype(np.int32) for doc in lengths]
    streams = [s if s.size > context else np.concatenate([s, np.full(context + 1 - s.size, 7, np.int32)]) for s in streams]
    corpus = DomainCorpus(tuple(f"d{k}" for k in range(len(streams))), tuple(streams), tuple(streams), ByteTokenizer(), {})
    ds = MixtureDataset(corpus, context=context)
    sp = split_pilot_pool(ds, eot_id=eot, share=share)
    assert not np.any(sp.held & ~sp.excluded)
    for k, part in enumerate(ds.parts):
        rows = slice(int(ds.starts[k]), int(ds.starts[k + 1]))
        docs = _doc_ids(part.stream, eot)
        win = np.arange(len(part))[:, None] * context + np.arange(context + 1)  # token positions of every window
        seen = set(docs[win[~sp.excluded[rows]]].ravel().tolist())
        held = set(docs[win[sp.held[rows]][:, 1:]].ravel().tolist())  # targets (a window may open on the eot before)
        if sp.boundary[k]:
            assert not seen & held  # no document on both sides of the cut
    base = domain_probabilities(ds.domain_ids, np.full(len(streams), 1 / len(streams)))
    try:
        p = sp.pilot_probabilities(base, ds.domain_ids)
    except InputError:  # a domain whose every window reaches into its held-out tail
        assert any(sp.excluded[ds.domain_ids == k].all() for k in range(len(streams)))
        return
    assert np.all(p[sp.excluded] == 0)
    assert np.allclose(np.bincount(ds.domain_ids, weights=p), np.bincount(ds.domain_ids, weights=base))
    n_held = min(int((sp.held & (ds.domain_ids == k)).sum()) for k in range(len(streams)))
    if n_held >= 1:
        probe = sp.probe(ds, per_domain=n_held, domains=corpus.domains, tokenizer=ByteTokenizer().spec())
        picked = probe.token_arrays["doc_pos"][::context] - 1  # the pool index of each probe window
        assert picked.size == n_held * len(streams) and sp.held[picked].all()
    with pytest.raises(InputError, match="held out from the pilot"):
        sp.probe(ds, per_domain=int(sp.held.sum()) + 1, domains=corpus.domains, tokenizer=ByteTokenizer().spec())


def test_mixture_degrades_gracefully_without_test_folder(tmp_path):
    (tmp_path / "pydoc_data").mkdir()
    (tmp_path / "pydoc_data" / "topics.py").write_text("topics = {'a': 'Some prose about a.', 'b': 'More prose.'}\n")
    (tmp_path / "mod.py").write_text("x = 1\n")
    docs = stdlib_mixture_documents(tmp_path)
    assert sorted({d.domain for d in docs}) == ["code", "prose"]
    with pytest.raises(InputError, match="none of the mixture domains"):
        stdlib_mixture_documents(tmp_path, domains=("certs",))


def test_relabel_and_prepare_domains_from_a_jsonl(tmp_path):
    rows = [{"text": f"{'abc ' * 200}{i}", "src": "A" if i % 2 else "B"} for i in range(12)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    corpus = prepare_domains(str(path), domain_field="src", min_tokens=64)
    assert set(corpus.domains) == {"A", "B"}
    ds = MixtureDataset(corpus, context=16)
    assert len(ds) == ds.counts.sum() and ds[len(ds) - 1].shape == (17,)
    assert corpus.val_windows(context=16, per_domain=3).shape == (2, 3, 17)
    docs = relabel_documents([Document(key="k", domain="x", text="t")], {"k": "y"})
    assert docs[0].domain == "y"
    with pytest.raises(InputError, match="expected a non-empty string"):
        relabel_documents(docs, lambda d: "")


def test_context_split_keeps_every_target():
    batch = torch.arange(2 * 17).reshape(2, 17)
    x, y = ContextSchedule.split(batch, 4)
    assert x.shape == (8, 4) and torch.equal(y.reshape(2, 16), batch[:, 1:]) and torch.equal(x.reshape(2, 16), batch[:, :-1])
    cs = ContextSchedule((4, 8, 16), (10, 20), total_steps=30)
    assert [cs.context(s) for s in (0, 9, 10, 19, 20, 29)] == [4, 4, 8, 8, 16, 16]


# -- the pipeline -------------------------------------------------------------------------


def test_curriculum_ab_quick_pipeline(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(ROOT / "pipelines" / "curriculum_ab.py"), "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["aa"]["draws_identical"] and res["aa"]["max_abs_final_loss_diff"] == 0.0
    assert res["aa_batches_identical"]["identical"]
    assert res["comparison"]["aa"]["speedup"]["mean"] == 0.0
    assert set(res["comparison"]) >= {"mixture", "reducible", "short_long"}
    assert res["positive_control"]["expected"] == pytest.approx(-1 / 9)
    assert res["enrichment"]["schedule"] >= 1.0 and res["validation"]["tokens"] >= 2048
    assert (tmp_path / "curves.png").exists()
    # tokdyn compare on the recorded reruns: they reproduce the runs, and A/A moved no event
    cmp = res["compare"]
    assert cmp["reruns_reproduce"]
    aa = cmp["arms"]["aa"]["overall"]
    assert aa["median_shift"] == 0.0 and aa["q25"] == 0.0 and aa["q75"] == 0.0 and aa["drop_share_earlier"] == 0.0
    ref = cmp["arms"][cmp["reference"]]["overall"]  # two baselines of different seeds: events do move
    assert cmp["reference"] == "base, seed 1" and ref["q75"] > ref["q25"] and ref["n_tokens"] > 0
    cli = subprocess.run([sys.executable, "-m", "tokdyn.cli", "compare", cmp["store"], "--run", "s0-base", "--run", "s0-mixture"],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert cli.returncode == 0 and "domain certs" in cli.stdout, cli.stderr
    bad = subprocess.run([sys.executable, "-m", "tokdyn.cli", "compare", cmp["store"], "--run", "s0-base"],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "exactly two runs" in bad.stderr
    # tokdyn curriculum schedule on the pilot: the same enrichment as the pipeline printed
    sched = subprocess.run([sys.executable, "-m", "tokdyn.cli", "curriculum", "schedule", str(tmp_path / "pilot.zarr"), "--run",
                            "pilot", "--steps", "40", "--out", str(tmp_path / "m.json"), "--json"],
                           capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert sched.returncode == 0, sched.stderr
    assert json.loads(sched.stdout)["enrichment"]["schedule"] == pytest.approx(res["enrichment"]["schedule"])
    assert load_mixture_schedule(tmp_path / "m.json").weights(39).shape == (len(res["domains"]),)


def test_hf_trainer_draws_the_mixture_samplers_sequence(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from tokdyn.curriculum.hf import CurriculumTrainer

    ids = np.repeat([0, 1], [30, 10])

    class Windows(torch.utils.data.Dataset):
        asked: list = []

        def __len__(self):
            return ids.size

        def __getitem__(self, i):
            self.asked.append(int(i))
            w = torch.arange(9) + int(i)
            return {"input_ids": w, "labels": w}

    sched = MixtureSchedule(_flat_rates([3.0, 1.0]), MixtureConfig(total_steps=4, floor=0.2))
    sampler = mixture_sampler(ids, sched, samples_per_step=4, seed=5)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=9, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=4, per_device_train_batch_size=4, report_to=[],
                             use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True)  # fmt: skip
    ds = Windows()
    CurriculumTrainer(model=model, args=args, train_dataset=ds, curriculum_sampler=sampler).train()
    assert ds.asked == np.concatenate([sampler.draws(s) for s in range(4)]).tolist()


def test_hf_trainer_calls_a_4x_trainer_with_its_own_signatures(monkeypatch):
    """Before transformers 4.46 ``Trainer.compute_loss`` takes no ``num_items_in_batch``, and
    before 5 ``_get_train_sampler`` takes no dataset: ``CurriculumTrainer`` passes each only
    where the Trainer gave it (a TypeError on 4.x before). Checked on any installed version,
    with the base class's two methods given their 4.40 signatures."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import transformers

    from tokdyn.curriculum.hf import CurriculumTrainer

    calls = []
    def old_compute_loss(self, model, inputs, return_outputs=False):
        calls.append(("loss", return_outputs))
        return 1.5

    monkeypatch.setattr(transformers.Trainer, "compute_loss", old_compute_loss)
    monkeypatch.setattr(transformers.Trainer, "_get_train_sampler", lambda self: calls.append("sampler") or "random")
    trainer = object.__new__(CurriculumTrainer)  # the methods under test read only these two
    trainer.token_weights = trainer.curriculum_sampler = None
    assert trainer.compute_loss(None, {}) == 1.5 and trainer.compute_loss(None, {}, return_outputs=True) == 1.5
    assert trainer._get_train_sampler() == "random"
    assert calls == [("loss", False), ("loss", True), "sampler"]
    # and on 4.46 onwards / 5.x, what the Trainer gives is passed on
    seen = {}
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        seen.update(n=num_items_in_batch)

    monkeypatch.setattr(transformers.Trainer, "compute_loss", compute_loss)
    monkeypatch.setattr(transformers.Trainer, "_get_train_sampler", lambda self, train_dataset=None: seen.update(ds=train_dataset))
    trainer.compute_loss(None, {}, num_items_in_batch=7)
    trainer._get_train_sampler("dataset")
    assert seen == {"n": 7, "ds": "dataset"}


def test_reuse_takes_only_matching_baselines(tmp_path):
    from dataclasses import asdict

    from tokdyn.curriculum.ab import MixtureABConfig, _reusable_base_runs

    cfg = MixtureABConfig.quick()
    run = {"final": [3.0, 3.1], "final_mixture": 3.05, "curve": [[3.0, 3.1]]}
    runs = [{"seed": 0, "arm": "base", "budget": 1.0, **run}, {"seed": 0, "arm": "mixture", "budget": 1.0, **run},
            {"seed": 9, "arm": "base", "budget": 1.0, **run}]  # fmt: skip
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"config": asdict(cfg), "runs": runs}))
    got = _reusable_base_runs(MixtureABConfig.quick(reuse=str(path)), lambda m: None)
    assert got == runs[:1]  # arms and other seeds are never taken
    path.write_text(json.dumps({"config": {**asdict(cfg), "steps": 41}, "runs": runs}))
    with pytest.raises(InputError, match="other settings"):
        _reusable_base_runs(MixtureABConfig.quick(reuse=str(path)), lambda m: None)


def test_a_diverged_seed_is_named_and_left_out_of_the_arm_mean():
    # a seed whose arm ended at a NaN loss dropped out of the mean and its interval with nothing
    # said but n; it was also listed as "outside the ladder"
    from tokdyn.curriculum.ab import MixtureABConfig, headline_lines, summarize_runs

    cfg = MixtureABConfig(seeds=(0, 1, 2, 3), arms=("mixture",), ladder=(0.8, 0.9, 1.0), steps=40, eval_points=4)
    domains = ("a", "b")
    curve = [[3.0, 3.1]] * 4
    runs = []
    for s in cfg.seeds:
        for b, loss in zip(cfg.ladder, (3.3, 3.2, 3.1)):
            runs.append({"seed": s, "arm": "base", "budget": b, "final_mixture": loss + 0.001 * s, "final": [loss, loss],
                         "curve": curve, "draws_sha256": "x"})  # fmt: skip
        end = float("nan") if s == 2 else 3.15 + 0.001 * s + 0.002 * (s % 2)
        runs.append({"seed": s, "arm": "mixture", "budget": 1.0, "final_mixture": end, "final": [end, end], "curve": curve,
                     "draws_sha256": "y"})  # fmt: skip
    res = summarize_runs(runs, cfg, domains)
    c = res["comparison"]["mixture"]
    assert c["diverged"] == [2] and 2 not in c["outside_ladder"]
    assert c["speedup"]["n"] == 3 and c["speedup"]["n_left_out"] == 1
    res.update(enrichment_verdict="-", aa_batches_identical={"identical": True})
    line = [x for x in headline_lines(res) if x.startswith("mixture")][0]
    assert line.endswith("n=3; loss not finite (diverged) on seeds [2], left out"), line
    assert paired_bootstrap([0.1, float("nan"), 0.2])["n_left_out"] == 1
    # a diverged rung of seed 1's baseline ladder: seed 1 named and left out of every figure (its
    # speed-up read off the finite rungs was still in the mean; a NaN last rung raised IndexError)
    for rung in (0.8, 1.0):
        runs2 = [dict(r, final_mixture=float("nan")) if (r["seed"], r["arm"], r["budget"]) == (1, "base", rung)
                 else dict(r, final_mixture=3.154) if (r["seed"], r["arm"]) == (2, "mixture") else r for r in runs]  # fmt: skip
        c = summarize_runs(runs2, cfg, domains)["comparison"]["mixture"]
        assert c["diverged"] == [1] and c["speedup"]["n"] == 3 and c["speedup"]["n_left_out"] == 1
        assert c["auc_ratio"]["n_left_out"] == 1 and c["final_loss_diff"]["n_left_out"] == 1
    assert matched_budget([0.8, 0.9, 1.0], [3.3, 3.2, float("nan")], 3.15)[0] != matched_budget([0.8, 0.9, 1.0], [3.3, 3.2, 3.1], 3.15)[0]


def _copied_domains(seed: int, k: int = 20) -> tuple[Events, np.ndarray]:
    """Two domains of 8 documents each, all drawn from one distribution (they differ by noise
    only), each document k copies of one event: 8 draws a domain however many tokens."""
    from dataclasses import replace

    rng = np.random.default_rng(seed)
    n = 16
    mu, delta = np.repeat(rng.uniform(0.5, 2.5, n), k), np.repeat(rng.uniform(0.5, 2.0, n), k)
    ev = Events(token=np.arange(n * k), mu=mu, s=np.full(n * k, 0.15), delta=delta, n_tokens=n * k, x_range=(0.0, 3.0))
    return replace(ev, unit=np.arange(n * k) // k, unit_kind="document"), np.repeat(np.arange(n) % 2, k)


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_domains_that_differ_by_noise_keep_the_baseline_and_the_tool_says_so(seed):
    """The rates' errors resample the probe's documents: two domains of 8 documents drawn alike
    differ by noise, the shrinkage removes it, and the verdict says that more documents would
    be needed (not that the domains fall in proportion). Resampled token by token, the 20
    copies of each document read as 20 times the data, and the same noise moves weight."""
    from dataclasses import replace

    ev, dom = _copied_domains(seed)
    cfg = MixtureConfig(total_steps=1000, floor=0.3)
    e = MixtureSchedule(DomainRates.from_events(ev, dom, ("a", "b")), cfg).enrichment()
    assert e["schedule"] == pytest.approx(1.0, abs=1e-3) and e["best"] < 1.05 <= e["best_unshrunk"]
    assert e["noise"] == {"significance": 2.0, "resampled": "documents", "n_units": 16}
    verdict = enrichment_verdict(e)
    assert "only within about 2 bootstrap errors over its probe's 16 documents: at this size that is noise" in verdict and "more documents per domain" in verdict
    by_token = MixtureSchedule(DomainRates.from_events(replace(ev, unit=None, unit_kind="token"), dom, ("a", "b")), cfg).enrichment()
    assert by_token["schedule"] > e["schedule"] + 0.004 and by_token["noise"]["n_units"] == 320


def test_domains_that_differ_beyond_noise_are_scheduled():
    """The positive control: the same documents' sizes, one domain's events a decade later."""
    rng = np.random.default_rng(0)
    n = 80
    dom = (np.arange(n) >= 40).astype(int)
    ev = Events(token=np.arange(n), mu=np.where(dom == 0, 1.0, 2.0) + 0.3 * rng.standard_normal(n), s=np.full(n, 0.15),
                delta=rng.uniform(0.5, 2, n), n_tokens=n, x_range=(0.0, 3.0), unit=np.arange(n) // 4, unit_kind="document")  # fmt: skip
    e = MixtureSchedule(DomainRates.from_events(ev, dom, ("a", "b")), MixtureConfig(total_steps=1000, floor=0.3)).enrichment()
    assert e["schedule"] > 1.2 and "more learnable-now loss drop" in enrichment_verdict(e)
    assert DomainRates.from_events(ev, dom, ("a", "b"), significance=0).noise is None  # nothing shrunk, nothing to say


def test_best_unshrunk_is_the_best_of_the_raw_rates_in_any_blocks():
    """``best_unshrunk`` (read a block of steps at a time) is the ``best`` of a schedule made
    from the unshrunk rates themselves, whatever the block."""
    ev, dom = _copied_domains(1)
    rates = DomainRates.from_events(ev, dom, ("a", "b"))
    cfg = MixtureConfig(total_steps=1000, floor=0.3)
    sched = MixtureSchedule(rates, cfg)
    raw = MixtureSchedule(rates.unshrunk, cfg).enrichment()
    want = (raw["best"], raw["unbounded"])
    e = sched.enrichment()
    assert (e["best_unshrunk"], e["unbounded_unshrunk"]) == pytest.approx(want, rel=1e-12)
    for block in (1, 7, 999, 1000, 5000):
        assert sched._best(rates.unshrunk, cfg.xs(), block) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_noise_held_back_by_the_floor_as_well_is_still_called_noise(seed):
    """A high floor holds even the raw rates' difference below what a schedule could use, but
    with floor 0 it would count: the domains still differ only by noise, and the verdict says
    so with both figures (it said the domains' loss falls in proportion, which it does not)."""
    ev, dom = _copied_domains(seed)
    e = MixtureSchedule(DomainRates.from_events(ev, dom, ("a", "b")), MixtureConfig(total_steps=1000, floor=0.9)).enrichment()
    assert e["best"] < 1.05 and e["unbounded"] < 1.05 and e["best_unshrunk"] < 1.05 <= e["unbounded_unshrunk"]
    verdict = enrichment_verdict(e)
    assert "falls in proportion" not in verdict and "at this size that is noise" in verdict
    assert f"best possible {e['best_unshrunk']:.3f} on them with this floor, {e['unbounded_unshrunk']:.3f} with floor 0" in verdict


def test_domains_without_sampling_noise_keep_their_whole_difference():
    """Every token of a domain identical (8 documents of 20 each): no resample can change a
    domain's rate per token, so the shrinkage takes nothing away, however the documents are
    drawn. With each resample's rate over a fixed token count (the review's finding), the swing
    of the documents drawn, 1/sqrt(8), read as noise and shrank the difference (a review's case
    of this kind: best enrichment 1.466 raw, 1.225 shrunk)."""
    n, k = 16, 20
    dom = np.repeat(np.arange(n) % 2, k)
    mu = np.where(dom == 0, 1.0, 2.0)
    ev = Events(token=np.arange(n * k), mu=mu, s=np.full(n * k, 0.15), delta=np.full(n * k, 1.0), n_tokens=n * k,
                x_range=(0.0, 3.0), unit=np.arange(n * k) // k, unit_kind="document")  # fmt: skip
    rates = DomainRates.from_events(ev, dom, ("a", "b"))
    np.testing.assert_allclose(rates.rates, rates.unshrunk.rates, rtol=1e-9, atol=1e-12)
    e = MixtureSchedule(rates, MixtureConfig(total_steps=1000, floor=0.3)).enrichment()
    assert e["best"] == pytest.approx(e["best_unshrunk"], rel=1e-9) and e["best"] > 1.3


def test_a_saved_schedule_keeps_what_its_shrinkage_took_away(tmp_path):
    """The file holds the raw rates and the noise: a loaded schedule's enrichment and verdict
    are the saved one's (without them, a schedule of noise read back as 'the domains' loss falls
    in proportion'). A file whose noise is not that record is refused in one line."""
    import json

    ev, dom = _copied_domains(0)
    sched = MixtureSchedule(DomainRates.from_events(ev, dom, ("a", "b")), MixtureConfig(total_steps=1000, floor=0.3))
    sched.save(tmp_path / "m.json")
    back = load_mixture_schedule(tmp_path / "m.json")
    assert back.enrichment() == sched.enrichment() and "noise" in enrichment_verdict(back.enrichment())
    d = json.loads((tmp_path / "m.json").read_text())
    d["rates"]["noise"] = {"significance": "2"}
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(InputError, match="not a valid mixture schedule: its rates' noise is not"):
        load_mixture_schedule(tmp_path / "bad.json")
