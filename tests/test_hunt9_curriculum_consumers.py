"""Hunt 9, what the next training run plugs in: samplers resumed on another rank or world size
(the usual "save on rank 0, load everywhere" was refused), steps and positions that are not
integers (2.7 read as step 2), token weights of ids outside the table's vocabulary or of float
ids (silently other tokens' weights), int32 labels under the Trainer (a raw RuntimeError),
a JSONL mixture without ``domain_field`` (every document silently 'default'), schedule files
that cannot be read (raw OSError / UnicodeDecodeError / RecursionError), configs of the wrong
type; each against an independent answer (the uninterrupted draw, chi-square, a hand loss)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tokdyn.curriculum import CoupledSampler, CurriculumSampler, TokenWeights, domain_probabilities
from tokdyn.curriculum.learnability import LearnabilityOptions, LearnabilityTable
from tokdyn.curriculum.mixture import DomainRates, MixtureConfig, MixtureSchedule, load_mixture_schedule, mixture_sampler
from tokdyn.curriculum.schedule import CurriculumConfig
from tokdyn.data import MixtureDataset, prepare_domains
from tokdyn.errors import InputError


def _schedule(steps: int = 40, floor: float = 0.1, domains=("a", "b", "c")) -> MixtureSchedule:
    """Three domains falling one after another: the weights move from the first to the last."""
    x = np.linspace(0, 2, 41)
    rates = np.stack([np.exp(-((x - c) ** 2) / 0.05) for c in (0.2, 0.9, 1.6)], axis=1)
    return MixtureSchedule(DomainRates(domains, x, rates), MixtureConfig(total_steps=steps, floor=floor))


IDS = np.random.default_rng(0).permutation(np.repeat([0, 1, 2], [30, 5, 13]))


# -- resuming on another rank or world size ---------------------------------------------------------


def _shares(samplers) -> list[list[int]]:
    return [list(s) for s in samplers]


@settings(max_examples=30, deadline=None)
@given(saved_world=st.sampled_from([1, 2, 4]), new_world=st.sampled_from([1, 2, 4]), k=st.integers(0, 12),
       seed=st.integers(0, 2**32 - 1), arm=st.booleans())  # fmt: skip
def test_a_state_saved_at_a_step_resumes_on_every_rank_of_any_world_size(saved_world, new_world, k, seed, arm):
    """Every rank of the new world, loading one rank's state, draws together exactly the
    uninterrupted run's steps k, k+1, ... (before: another rank, or another world size, was
    refused: {'rank': (0, 1)})."""
    sched = _schedule(steps=12)
    spb = 8
    whole = mixture_sampler(IDS, sched, samples_per_step=spb, seed=seed, arm=arm)
    saver = mixture_sampler(IDS, sched, samples_per_step=spb, seed=seed, arm=arm, rank=0, world_size=saved_world)
    state = saver.state_dict(step=k)
    resumed = []
    for r in range(new_world):
        s = mixture_sampler(IDS, sched, samples_per_step=spb, seed=seed, arm=arm, rank=r, world_size=new_world)
        s.load_state_dict(json.loads(json.dumps(state)))  # a checkpoint written as JSON
        resumed.append(list(s))
    per = spb // new_world
    for t in range(k, 12):
        step = np.concatenate([np.asarray(resumed[r][(t - k) * per : (t - k + 1) * per]) for r in range(new_world)])
        assert sorted(step.tolist()) == sorted(whole.draws(t).tolist())
        for r in range(new_world):  # each rank's share is its slice of the step's draw
            assert resumed[r][(t - k) * per : (t - k + 1) * per] == whole.draws(t)[r::new_world].tolist()


def test_another_rank_of_the_same_world_resumes_mid_step_and_another_world_only_at_a_boundary():
    sched = _schedule(steps=10)
    r0 = mixture_sampler(IDS, sched, samples_per_step=8, seed=3, rank=0, world_size=2)
    it = iter(r0)
    for _ in range(4 * 3 + 1):  # inside step 3
        next(it)
    state = r0.state_dict()
    r1 = mixture_sampler(IDS, sched, samples_per_step=8, seed=3, rank=1, world_size=2)
    r1.load_state_dict(state)
    assert list(r1) == np.concatenate([r1.draws(t)[1::2] for t in range(10)]).tolist()[4 * 3 + 1 :]
    other = mixture_sampler(IDS, sched, samples_per_step=8, seed=3, rank=0, world_size=4)
    with pytest.raises(InputError, match=r"middle of step 3.*state_dict\(step=k\)"):
        other.load_state_dict(state)
    with pytest.raises(InputError, match="saved world_size"):
        other.load_state_dict({**state, "world_size": 3})
    v1 = CurriculumSampler(None, n_samples=20, total_steps=6, samples_per_step=6, seed=1, rank=2, world_size=3)
    v1b = CurriculumSampler(None, n_samples=20, total_steps=6, samples_per_step=6, seed=1, rank=1, world_size=2)
    v1b.load_state_dict(v1.state_dict(step=2))
    assert list(v1b) == np.concatenate([v1b.draws(t)[1::2] for t in range(2, 6)]).tolist()


# -- steps and positions that are not integers --------------------------------------------------------

_S = mixture_sampler(IDS, _schedule(), samples_per_step=8, seed=4)
BAD_STEPS = {  # before: the first six read as another step or position, silently; the rest raw errors
    "state_dict(step=2.5)": lambda: _S.state_dict(step=2.5),
    "state_dict(step='3')": lambda: _S.state_dict(step="3"),
    "load position 3.7": lambda: _S.load_state_dict({**_S.state_dict(), "position": 3.7}),
    "load position True": lambda: _S.load_state_dict({**_S.state_dict(), "position": True}),
    "weights(2.7)": lambda: _schedule().weights(2.7),
    "weights(-0.5)": lambda: _schedule().weights(-0.5),
    "weights('3')": lambda: _schedule().weights("3"),
    "load position 'abc'": lambda: _S.load_state_dict({**_S.state_dict(), "position": "abc"}),
    "load position None": lambda: _S.load_state_dict({**_S.state_dict(), "position": None}),
    "weights(None)": lambda: _schedule().weights(None),
    "check_step(None)": lambda: CurriculumConfig(total_steps=5).check_step(None),
    "check_step(nan)": lambda: CurriculumConfig(total_steps=5).check_step(float("nan")),
    "check_step(inf)": lambda: CurriculumConfig(total_steps=5).check_step(float("inf")),
}


@pytest.mark.parametrize("case", list(BAD_STEPS))
def test_a_step_or_position_that_is_not_an_integer_is_one_input_error(case):
    with pytest.raises(InputError):
        BAD_STEPS[case]()


def test_integral_steps_of_any_int_type_still_work():
    s = _schedule()
    assert np.array_equal(s.weights(np.int64(3)), s.weights(3)) and np.array_equal(s.weights(3.0), s.weights(3))
    assert _S.state_dict(step=np.int64(2))["position"] == 16


# -- configs, pools and probabilities of the wrong type ----------------------------------------------

BAD_ARGS = {  # before: TypeError / ValueError / AttributeError, or a bool taken as 1, or a str as its letters
    "CurriculumConfig(width='0.3')": lambda: CurriculumConfig(total_steps=10, width="0.3"),
    "CurriculumConfig(floor='0.3')": lambda: CurriculumConfig(total_steps=10, floor="0.3"),
    "CurriculumConfig(temperature=None)": lambda: CurriculumConfig(total_steps=10, temperature=None),
    "CurriculumConfig(total_steps=True)": lambda: CurriculumConfig(total_steps=True),
    "CoupledSampler(base=['a', 'b'])": lambda: CoupledSampler(["a", "b"], samples_per_step=2, total_steps=3),
    "domain_probabilities(weights=['a', 'b'])": lambda: domain_probabilities(np.array([0, 1]), ["a", "b"]),
    "mixture_sampler(schedule='m.json')": lambda: mixture_sampler(IDS, "m.json", samples_per_step=8),
    "mixture_sampler(domains='abc')": lambda: mixture_sampler(IDS, _schedule(), samples_per_step=8, domains="abc"),
    "mixture_sampler(domains=['a', 'a', 'c'])": lambda: mixture_sampler(IDS, _schedule(), samples_per_step=8,
                                                                       domains=["a", "a", "c"]),  # fmt: skip
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_an_argument_of_the_wrong_type_is_one_input_error(case):
    with pytest.raises(InputError):
        BAD_ARGS[case]()


# -- a mixture dataset is matched to the schedule by name ------------------------------------------


def _corpus_docs(order):
    from tokdyn.corpus import Document

    text = {"a": "alpha " * 400, "b": "bravo " * 400, "c": "charlie " * 400}
    return [Document(key=f"{d}{i}", domain=d, text=text[d] + str(i)) for d in order for i in range(3)]


def test_a_mixture_dataset_in_another_domain_order_draws_the_schedules_domain_weights():
    """The pool numbers its domains c, a, b; the schedule a, b, c. Given the dataset, the draws'
    domain frequencies follow the schedule's weights (chi-square); before, MixtureDataset had
    no domain names, and its ids alone would have been read in the schedule's order."""
    corpus = prepare_domains(_corpus_docs("cab"), min_tokens=64)
    ds = MixtureDataset(corpus, context=16)
    assert ds.domains == ("c", "a", "b")
    sched = _schedule(steps=40, floor=0.1)
    sampler = mixture_sampler(ds, sched, samples_per_step=4000, seed=2)
    names = np.array(ds.domains)
    for t in (0, 20, 39):
        got = names[ds.domain_ids[sampler.draws(t)]]
        counts = np.array([(got == d).sum() for d in sched.domains])
        assert stats.chisquare(counts, sched.weights(t) * counts.sum()).pvalue > 1e-4
    by_ids = mixture_sampler(ds.domain_ids, sched, samples_per_step=4000, seed=2, domains=ds.domains)
    assert np.array_equal(by_ids.draws(5), sampler.draws(5))


# -- a JSONL mixture without domain_field -----------------------------------------------------------


def _jsonl(tmp_path):
    path = tmp_path / "mix.jsonl"
    lines = [json.dumps({"text": f"{w} " * 300 + str(i), "domain": w, "id": str(i)}) for w in ("x", "y") for i in range(4)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_jsonl_mixture_without_domain_field_is_refused_naming_the_field(tmp_path):
    """Before: every document silently labelled 'default', a one-domain 'mixture'."""
    path = _jsonl(tmp_path)
    with pytest.raises(InputError, match=r"domain_field=.*domain_field='domain'"):
        prepare_domains(str(path), min_tokens=64)
    assert prepare_domains(str(path), domain_field="domain", min_tokens=64).domains == ("x", "y")
    assert prepare_domains(path, domain_field="domain", min_tokens=64).domains == ("x", "y")  # a Path: was a TypeError
    one = prepare_domains(str(path), mapping=lambda d: "all", min_tokens=64)  # one domain, said on purpose
    assert one.domains == ("all",)


def test_domain_field_for_a_source_without_fields_is_refused(tmp_path):
    (tmp_path / "d" / "x").mkdir(parents=True)
    (tmp_path / "d" / "x" / "f.txt").write_text("text " * 100)
    with pytest.raises(InputError, match="applies to a .jsonl source only"):
        prepare_domains(str(tmp_path / "d"), domain_field="domain", min_tokens=64)
    # the reader every source goes through refuses them, so a probe made in Python does too
    from tokdyn.data import load_documents, prepare_probe

    for call in (lambda: load_documents("stdlib-mix", text_field="body"),
                 lambda: prepare_probe(str(tmp_path / "d"), domain_field="domain")):  # fmt: skip
        with pytest.raises(InputError, match="applies to a .jsonl source only"):
            call()


# -- schedule files that cannot be read ------------------------------------------------------------


def test_a_schedule_file_that_cannot_be_read_is_one_input_error(tmp_path):
    good = _schedule().save(tmp_path / "m.json")
    assert load_mixture_schedule(good).domains == ("a", "b", "c")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00\x80garbage")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    for path in (tmp_path, tmp_path / "bin.json", tmp_path / "deep.json"):  # before: IsADirectoryError,
        with pytest.raises(InputError, match="mixture schedule"):  # UnicodeDecodeError, RecursionError
            load_mixture_schedule(path)
    with pytest.raises(InputError, match="file path"):  # before: file descriptor 3 read, then closed
        load_mixture_schedule(3)


# -- token weights -------------------------------------------------------------------------------------


def _table() -> LearnabilityTable:
    """Order 1, vocabulary 8: even ids learned at x 1 dropping 3 nats, odd ones at x 2 dropping 1."""
    tok = np.random.default_rng(0).integers(0, 8, (60, 9))
    t = tok[:, 1:].reshape(-1)
    mu, delta = np.where(t % 2 == 0, 1.0, 2.0), np.where(t % 2 == 0, 3.0, 1.0)
    return LearnabilityTable.fit(tok, {"mu": mu, "delta": delta, "weight": delta}, vocab_size=8,
                                 options=LearnabilityOptions(order=1, holdout=0, prior=0))  # fmt: skip


def _hand_weights(tokens: np.ndarray, step: int, *, floor: float, width: float) -> np.ndarray:
    x = math.log10(step + 1)
    t = tokens[:, 1:]
    mu, delta = np.where(t % 2 == 0, 1.0, 2.0), np.where(t % 2 == 0, 3.0, 1.0)
    z = np.abs((x - mu) / width)
    u = delta * np.exp(-z) / (1 + np.exp(-z)) ** 2 / width
    return floor + (1 - floor) * u / u.mean()


@settings(max_examples=30, deadline=None)
@given(dtype=st.sampled_from([torch.int64, torch.int32, torch.int16, torch.uint8]), step=st.integers(0, 99),
       batch=st.integers(1, 4), seed=st.integers(0, 1000))  # fmt: skip
def test_token_weights_of_any_integer_dtype_and_batch_size_are_the_hand_computed_ones(dtype, step, batch, seed):
    tw = TokenWeights(_table(), CurriculumConfig(total_steps=100, floor=0.2, width=0.3), tokenizer=8)
    tokens = np.random.default_rng(seed).integers(0, 8, (batch, 9))
    for s in (step, torch.tensor(step)):
        w = tw(torch.from_numpy(tokens).to(dtype), s).numpy()
        np.testing.assert_allclose(w, _hand_weights(tokens, step, floor=0.2, width=0.3), rtol=2e-5, atol=1e-6)


BAD_TOKENS = {  # before: the weights of other tokens, silently
    "an id past the vocabulary": (lambda t: t + 3, "span"),
    "a negative id (-100 labels)": (lambda t: torch.where(t == 0, -100, t), "span"),
    "float ids": (lambda t: t.float(), "integer token ids"),
    "bool ids": (lambda t: t > 3, "integer token ids"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_token_ids_the_table_cannot_weigh_are_one_input_error(case):
    tw = TokenWeights(_table(), CurriculumConfig(total_steps=10), tokenizer=8)
    tokens = torch.from_numpy(np.random.default_rng(1).integers(0, 8, (3, 9)))
    make, says = BAD_TOKENS[case]
    with pytest.raises(InputError, match=says):
        tw(make(tokens), 2)


@pytest.mark.parametrize("step", [torch.tensor([3, 4]), torch.tensor(3.5), torch.tensor(10), torch.tensor(True)])
def test_a_step_tensor_that_is_not_one_update_in_range_is_one_input_error(step):
    tw = TokenWeights(_table(), CurriculumConfig(total_steps=10), tokenizer=8)
    with pytest.raises(InputError, match="step"):  # before: a broadcast error, or weights of step 3.5 / 10
        tw(torch.zeros(2, 9, dtype=torch.long), step)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_an_id_past_the_vocabulary_gives_nan_weights_without_a_host_sync():
    tw = TokenWeights(_table(), CurriculumConfig(total_steps=10), tokenizer=8, device="cuda")
    tokens = torch.from_numpy(np.random.default_rng(1).integers(0, 8, (3, 9))).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        good, bad = tw(tokens, 2), tw(tokens + 3, 2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(good).all() and torch.isnan(bad).all()


# -- the Trainer's weighted loss -------------------------------------------------------------------------


def _trainer(tmp_path, model_vocab: int):
    """A tiny GPT-2 of ``model_vocab`` ids under a CurriculumTrainer weighted by a table of 8."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from tokdyn.curriculum.hf import CurriculumTrainer

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=model_vocab, n_positions=9, n_embd=16, n_layer=1, n_head=2)).eval()
    tw = TokenWeights(_table(), CurriculumConfig(total_steps=10, floor=0.2), tokenizer=8)
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), report_to=[], use_cpu=True, save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, max_steps=1)  # fmt: skip
    trainer = CurriculumTrainer(model=model, args=args, train_dataset=[{"input_ids": torch.zeros(9, dtype=torch.long)}],
                                token_weights=tw)  # fmt: skip
    return trainer, model, tw


def test_the_trainers_weighted_loss_takes_int32_labels_and_is_the_hand_loss(tmp_path):
    trainer, model, tw = _trainer(tmp_path, 8)
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, 8, (3, 9)))
    labels = ids.clone()
    labels[:, :4] = -100
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        w = tw(ids, 0) * (labels[:, 1:] != -100)
        nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, reduction="none")
        hand = float((w.flatten() * nll).sum() / w.sum())
        for dt in (torch.int64, torch.int32):  # before: int32 labels were a raw RuntimeError
            got = float(trainer.compute_loss(model, {"input_ids": ids.to(dt), "labels": labels.to(dt)}))
            assert got == pytest.approx(hand, rel=1e-5)
        with pytest.raises(InputError, match="input_ids"):
            trainer.compute_loss(model, {"inputs_embeds": torch.zeros(3, 9, 16), "labels": labels})


def test_the_trainer_stops_at_ids_outside_the_table_on_any_device(tmp_path):
    """On a device TokenWeights makes such a batch's weights NaN (no sync); under the Trainer,
    which leaves a NaN loss out of its logs (logging_nan_inf_filter) while its gradients turn
    every parameter NaN, that hid a ruined run (a pad id added after the pilot: the review's
    reproduction logged losses 0.0 and grad_norm nan). The Trainer now checks on the host."""
    trainer, model, tw = _trainer(tmp_path, 10)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 8, (2, 9)))
    ids[1, 5] = 9  # the model takes it, the table does not
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(InputError, match=r"token ids span \[\d+, 9\] but the learnability table was built for a vocabulary of 8"):
        trainer.compute_loss(model, {"input_ids": ids, "labels": ids})
    assert not calls  # refused before the forward
    tw.check_ids(ids[:1])  # in range: nothing


# -- the coupled arm's draws follow its probabilities ---------------------------------------------


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 30))
def test_the_coupled_arm_draws_its_probabilities_and_differs_from_the_base_by_their_distance(seed, n):
    rng = np.random.default_rng(seed % 1000)
    p0, p = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n) * 0.5)
    p0[0], p[-1] = 0.0, 0.0  # a sample the base never draws, one the arm never draws
    p0, p = p0 / p0.sum(), p / p.sum()
    arm = CoupledSampler(p0, p, samples_per_step=2000, total_steps=5, seed=seed)
    base = CoupledSampler(p0, None, samples_per_step=2000, total_steps=5, seed=seed)
    draws = np.concatenate([arm.draws(t) for t in range(5)])
    counts = np.bincount(draws, minlength=n)
    assert counts[-1] == 0
    keep = p * counts.sum() >= 5  # chi-square over cells with enough expected draws, the rest pooled
    exp = np.append(p[keep], p[~keep].sum()) * counts.sum()
    obs = np.append(counts[keep], counts[~keep].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    assert stats.chisquare(obs, exp).pvalue > 1e-5 if obs.size > 1 else obs[0] == exp[0]
    differ = np.mean(np.concatenate([arm.draws(t) != base.draws(t) for t in range(5)]))
    tv = 0.5 * np.abs(p - p0).sum()
    assert abs(differ - tv) < 5 * math.sqrt(tv * (1 - tv) / draws.size) + 1e-9


@pytest.mark.parametrize("name", ["mix.JSONL", "mix.Jsonl", "mix.jsonl"])
def test_a_jsonl_source_is_one_in_any_case_of_its_extension(tmp_path, name):
    # DATA.JSONL was read as one text document of JSON lines, its fields text
    import json

    from tokdyn.data import load_documents

    path = tmp_path / name
    path.write_text("\n".join(json.dumps({"text": f"document {i} " * 20, "d": "ab"[i % 2]}) for i in range(6)) + "\n")
    docs = load_documents(str(path), domain_field="d")
    assert len(docs) == 6 and {d.domain for d in docs} == {"a", "b"}
    assert all(not d.text.lstrip().startswith("{") for d in docs)
    with pytest.raises(InputError, match="domain_field"):
        prepare_domains(str(path))
