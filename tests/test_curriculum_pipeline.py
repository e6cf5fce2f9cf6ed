"""The curriculum end to end at tiny sizes: a pilot recorded on training samples and fitted, the
``tokdyn curriculum`` CLI, the HF Trainer with the sampler and with token weights, the A/B
experiment, and the errors for a pilot without events."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

import tokdyn
from tokdyn.store import as_store
from tokdyn.cli import main
from tokdyn.curriculum import (
    CurriculumConfig,
    CurriculumSampler,
    SampleSchedule,
    TokenWeights,
    build_table,
    load_table,
    pilot_probe,
    run_pilot,
)
from tokdyn.curriculum.experiment import ABConfig, compare_curves, run_ab
from tokdyn.data import WindowDataset, prepare_corpus
from tokdyn.errors import StoreError
from tokdyn.fit import fit_run
from tokdyn.model import GPTConfig
from tokdyn.train import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few standard-library packages as a small text corpus (fast to sample and bin)."""
    src = Path(sysconfig.get_paths()["stdlib"])
    root = tmp_path_factory.mktemp("corpus")
    for pkg in ("json", "email", "http", "urllib", "wsgiref"):
        shutil.copytree(src / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return prepare_corpus(str(root), context=CONTEXT, n_probe_sequences=8)


@pytest.fixture(scope="module")
def pilot(corpus, tmp_path_factory):
    store = tmp_path_factory.mktemp("pilot") / "pilot.zarr"
    mcfg = GPTConfig(vocab_size=corpus.tokenizer.vocab_size, context=CONTEXT, n_layer=1, n_head=2, n_embd=32)
    stats = run_pilot(store, corpus=corpus, model_config=mcfg, train_config=TrainConfig(steps=40, batch_size=8, seed=5),
                      n_sequences=48, n_points=12)  # fmt: skip
    return store, stats


def test_pilot_probe_is_drawn_from_training_windows(corpus):
    probe = pilot_probe(corpus.train_tokens, context=CONTEXT, n_sequences=20, tokenizer=corpus.tokenizer.spec(), seed=3)
    ds = WindowDataset(corpus.train_tokens, context=CONTEXT)
    starts = probe.token_arrays["doc_pos"][:: CONTEXT] - 1  # doc_pos of each window's first target, minus 1
    for row, start in zip(probe.tokens, starts):
        assert start % CONTEXT == 0
        np.testing.assert_array_equal(row, ds[start // CONTEXT].numpy())
    assert probe.tokenizer == corpus.tokenizer.spec()


def test_cli_builds_and_shows_a_table_from_a_fitted_pilot(pilot, corpus, tmp_path, capsys):
    store, stats = pilot
    assert stats["fit"]["n_tokens"] == 48 * CONTEXT
    out = tmp_path / "learn.npz"
    assert main(["curriculum", "build", str(store), "--run", "pilot", "--out", str(out), "--min-count", "2"]) == 0
    text = capsys.readouterr().out
    assert "rank corr" in text and str(out) in text
    table = load_table(out)
    assert table.meta["pilot"]["run"] == "pilot" and table.meta["tokenizer"] == corpus.tokenizer.spec()
    v = table.validation
    assert v["n_tokens"] == round(0.2 * 48) * CONTEXT
    assert -1 <= v["mu_spearman"] <= 1 and v["delta_mae"] >= 0
    assert sum(v["level_share"].values()) == pytest.approx(1.0)
    assert main(["curriculum", "show", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["n_keys"] == table.n_keys and shown["validation"] == v
    # the table drives a schedule over the corpus's training samples
    sched = SampleSchedule(table, WindowDataset(corpus.train_tokens, context=CONTEXT),
                           CurriculumConfig(total_steps=60), tokenizer=corpus.tokenizer)  # fmt: skip
    p = sched.probabilities(10)
    assert p.sum() == pytest.approx(1.0) and p.min() >= 0.3 / p.size * (1 - 1e-12)


def test_pilot_without_fit_or_events_gives_one_clear_error(pilot, corpus, tmp_path, capsys):
    store, _ = pilot
    st = tokdyn.open_store(store, mode="r+")
    # a run with no fit
    probe = st.probe
    r = st.create_run("flat", capacity=12)
    w = r.writer()
    for k, step in enumerate([1, 2, 4, 8, 16, 32, 64, 128, 256, 512]):
        w.append(np.full(probe.n_tokens, 3.0, np.float32), step=step)
    assert main(["curriculum", "build", str(store), "--run", "flat", "--out", str(tmp_path / "t.npz")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has not been fitted" in err
    # fitted, but flat: no learning events
    fit_run(as_store(str(store), mode="r+").run("flat"), progress=False)
    with pytest.raises(StoreError, match="no learning event with a positive loss drop"):
        build_table(str(store), "flat")
    assert main(["curriculum", "build", str(store), "--run", "flat", "--out", str(tmp_path / "t.npz")]) == 1
    assert "no learning event" in capsys.readouterr().err
    assert main(["curriculum", "build", str(store), "--run", "pilot", "--out", str(tmp_path / "t.txt")]) == 1


def _hf_setup(corpus, pilot, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    class Windows(torch.utils.data.Dataset):
        def __init__(self):
            self.ds = WindowDataset(corpus.train_tokens, context=CONTEXT)
            self.asked = []

        def __len__(self):
            return len(self.ds)

        def __getitem__(self, i):
            self.asked.append(int(i))
            w = self.ds[i]
            return {"input_ids": w, "labels": w}

    torch.manual_seed(0)
    no_dropout = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=corpus.tokenizer.vocab_size, n_positions=CONTEXT + 1, n_embd=16,
                                       n_layer=1, n_head=2, **no_dropout))  # fmt: skip
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=4, per_device_train_batch_size=4, report_to=[],
                             use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True)  # fmt: skip
    table = build_table(str(pilot[0]), "pilot")
    return model, args, Windows(), table


def test_hf_trainer_draws_the_curriculum_samplers_sequence(corpus, pilot, tmp_path):
    from tokdyn.curriculum.hf import CurriculumTrainer

    model, args, ds, table = _hf_setup(corpus, pilot, tmp_path)
    sched = SampleSchedule(table, ds.ds, CurriculumConfig(total_steps=4), tokenizer=corpus.tokenizer)
    sampler = CurriculumSampler(sched, samples_per_step=4, seed=11)
    CurriculumTrainer(model=model, args=args, train_dataset=ds, curriculum_sampler=sampler).train()
    expected = np.concatenate([sampler.draws(s) for s in range(4)]).tolist()
    assert ds.asked == expected


def test_hf_trainer_weights_token_losses(corpus, pilot, tmp_path):
    import torch.nn.functional as F

    from tokdyn.curriculum.hf import CurriculumTrainer

    model, args, ds, table = _hf_setup(corpus, pilot, tmp_path)
    tw = TokenWeights(table, CurriculumConfig(total_steps=4, floor=0.2), tokenizer=corpus.tokenizer)
    trainer = CurriculumTrainer(model=model, args=args, train_dataset=ds, token_weights=tw)
    batch = torch.stack([ds.ds[i] for i in range(3)])
    batch_in = {"input_ids": batch, "labels": batch.clone()}
    batch_in["labels"][0, 5] = -100  # an ignored target gets no weight
    loss = trainer.compute_loss(model, batch_in)
    with torch.no_grad():
        logits = model(input_ids=batch).logits
    w = tw(batch, 0)
    w[0, 4] = 0.0
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten(), reduction="none").view_as(w)
    assert loss.item() == pytest.approx(((w * nll).sum() / w.sum()).item(), rel=1e-5)
    trainer.train()
    assert trainer.state.global_step == 4


def test_ab_experiment_quick(corpus, tmp_path):
    res = run_ab(tmp_path / "ab", ABConfig.quick(seeds=(0, 1), steps=30, eval_points=5), corpus=corpus, log=lambda s: None)
    assert (tmp_path / "ab" / "curves.png").stat().st_size > 0 and (tmp_path / "ab" / "learnability.npz").exists()
    saved = json.loads((tmp_path / "ab" / "results.json").read_text())
    assert set(saved["comparison"]) == {"sample", "token"}
    for arm in ("sample", "token"):  # the summary follows from the stored curves
        curves = {arm_: {int(s): c for s, c in by.items()} for arm_, by in saved["curves"].items()}
        again = compare_curves(curves["baseline"], curves[arm])
        assert again["per_seed"] == res["comparison"][arm]["per_seed"]
    base = saved["curves"]["baseline"]["0"]
    assert base["steps"] == [6, 12, 18, 24, 30] and len(base["val_loss"]) == 5
    assert base["val_loss"][-1] < base["val_loss"][0]
    diag = saved["weight_diagnostics"]["width"]
    for name in ("sample_effective_share", "token_effective_share"):
        assert all(0 < v <= 1 + 1e-9 for v in diag[name]) and len(diag[name]) == len(diag["steps"])
    # the token arm sees the same batches as the baseline, so only the weights differ
    assert saved["curves"]["token"]["0"]["val_loss"] != base["val_loss"]


@pytest.mark.slow
def test_curriculum_ab_pipeline_quick(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "pipelines" / "curriculum_ab.py"), "--v1", "--quick", "--out", str(tmp_path / "q")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    head = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(head["arms"]) == {"sample", "token"} and -1 <= head["mu_spearman"] <= 1
