"""The samplers a researcher plugs into the next run, against independent answers: the Hugging
Face Trainer's updates are the schedule's steps (or one clear error), the mixture sampler
resumes mid-run to the uninterrupted sequence and splits a step between ranks into disjoint,
complete shares whose domain frequencies follow the schedule (chi-square), draws that do not
follow a distribution are refused, seeds never share draws, domain ids and numpy-typed configs
give one clear error or a valid file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tokdyn.curriculum import CoupledSampler, CurriculumSampler, domain_probabilities
from tokdyn.curriculum.mixture import DomainRates, MixtureConfig, MixtureSchedule, load_mixture_schedule, mixture_sampler
from tokdyn.errors import InputError


def _schedule(steps: int = 50, floor: float = 0.1, base=(0.5, 0.3, 0.2)) -> MixtureSchedule:
    """Three domains falling one after another: the weights move from 'a' to 'b' to 'c'."""
    x = np.linspace(0, 2, 41)
    rates = np.stack([np.exp(-((x - c) ** 2) / 0.05) for c in (0.2, 0.9, 1.6)], axis=1)
    return MixtureSchedule(DomainRates(("a", "b", "c"), x, rates), MixtureConfig(total_steps=steps, floor=floor), base=list(base))


IDS = np.random.default_rng(0).permutation(np.repeat([0, 1, 2], [40, 1, 7]))  # 'b' is a single document


# -- the mixture sampler through a DataLoader: resume and ranks ------------------------------------


def test_the_mixture_sampler_resumes_mid_run_to_the_uninterrupted_sequence():
    sched = _schedule()
    full = list(mixture_sampler(IDS, sched, samples_per_step=8, seed=4))
    assert full == np.concatenate([mixture_sampler(IDS, sched, samples_per_step=8, seed=4).draws(t) for t in range(50)]).tolist()
    s = mixture_sampler(IDS, sched, samples_per_step=8, seed=4)
    it = iter(s)
    head = [next(it) for _ in range(8 * 17 + 3)]  # stop inside step 17
    resumed = mixture_sampler(IDS, sched, samples_per_step=8, seed=4)
    resumed.load_state_dict(s.state_dict())
    assert head + list(resumed) == full
    # a DataLoader with workers prefetches ahead: save "the start of step k" instead
    loader_sampler = mixture_sampler(IDS, sched, samples_per_step=8, seed=4)
    at = mixture_sampler(IDS, sched, samples_per_step=8, seed=4)
    at.load_state_dict(loader_sampler.state_dict(step=30))
    batches = list(torch.utils.data.DataLoader(torch.arange(IDS.size), batch_size=8, sampler=at, num_workers=2))
    assert torch.cat(batches).tolist() == full[30 * 8 :]
    # a state of another schedule, pool or seed is refused
    state = s.state_dict()
    for other in (mixture_sampler(IDS, _schedule(floor=0.5), samples_per_step=8, seed=4),
                  mixture_sampler(IDS[::-1].copy(), sched, samples_per_step=8, seed=4),
                  mixture_sampler(IDS, sched, samples_per_step=8, seed=5)):  # fmt: skip
        with pytest.raises(InputError, match="does not match"):
            other.load_state_dict(state)


@settings(max_examples=25, deadline=None)
@given(world=st.integers(1, 4), per_rank=st.integers(1, 5), seed=st.integers(0, 2**32 - 1), arm=st.booleans())
def test_mixture_ranks_get_disjoint_complete_shares_of_every_step(world, per_rank, seed, arm):
    sched = _schedule(steps=6)
    whole = mixture_sampler(IDS, sched, samples_per_step=world * per_rank, seed=seed, arm=arm)
    ranks = [list(mixture_sampler(IDS, sched, samples_per_step=world * per_rank, seed=seed, arm=arm, rank=r, world_size=world))
             for r in range(world)]  # fmt: skip
    assert all(len(r) == 6 * per_rank for r in ranks)
    for t in range(6):
        draw = whole.draws(t)
        for r in range(world):  # rank r's share of step t: the draws r, r + world, ... (disjoint positions)
            assert ranks[r][t * per_rank : (t + 1) * per_rank] == draw[r::world].tolist()
        together = sorted(i for r in ranks for i in r[t * per_rank : (t + 1) * per_rank])
        assert together == sorted(draw.tolist())  # complete: the step's whole draw


def test_the_ranks_draw_the_schedules_domain_frequencies():
    """Chi-square of the domains drawn by 4 ranks together against the schedule's weights, at the
    steps where the weights differ most; fixed seed, and a p-value floor no correct sampler
    reaches by chance (1e-6)."""
    sched = _schedule(steps=50)
    per_rank, world = 2500, 4
    ranks = [mixture_sampler(IDS, sched, samples_per_step=per_rank * world, seed=11, rank=r, world_size=world)
             for r in range(world)]  # fmt: skip
    for t in (0, 6, 40):
        drawn = np.concatenate([np.asarray(list(r))[t * per_rank : (t + 1) * per_rank] for r in ranks])
        counts = np.bincount(IDS[drawn], minlength=3)
        assert stats.chisquare(counts, sched.weights(t) * counts.sum()).pvalue > 1e-6
    assert not np.allclose(sched.weights(0), sched.weights(40), atol=0.3)  # the test can tell the steps apart


# -- the Hugging Face Trainer's updates are the schedule's steps ------------------------------------


@pytest.fixture(scope="module")
def hf_model():
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=9, n_embd=16, n_layer=1, n_head=2))


class _Windows(torch.utils.data.Dataset):
    def __len__(self):
        return IDS.size

    def __getitem__(self, i):
        w = torch.arange(9) + int(i)
        return {"input_ids": w, "labels": w}


def _trainer(model, tmp_path, sampler, **args):
    from transformers import TrainingArguments

    from tokdyn.curriculum.hf import CurriculumTrainer

    args = TrainingArguments(output_dir=str(tmp_path / "hf"), report_to=[], use_cpu=True, save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, **args)  # fmt: skip
    return CurriculumTrainer(model=model, args=args, train_dataset=_Windows(), curriculum_sampler=sampler)


MISMATCHED = {  # before: the schedule at half speed, or drawn again from step 0 after its end
    "half the global batch": (dict(max_steps=4, per_device_train_batch_size=2), "global batch is 2"),
    "twice the global batch": (dict(max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2), "global batch is 8"),
    "more steps than the schedule": (dict(max_steps=8, per_device_train_batch_size=4), "max_steps is 8"),
    "three epochs": (dict(num_train_epochs=3, per_device_train_batch_size=4), "num_train_epochs is 3"),
}


@pytest.mark.parametrize("case", list(MISMATCHED))
@pytest.mark.parametrize("kind", ["mixture", "v1 uniform"])
def test_the_trainer_refuses_updates_that_are_not_the_schedules_steps(case, kind, hf_model, tmp_path):
    sampler = (mixture_sampler(IDS, _schedule(steps=4), samples_per_step=4, seed=5) if kind == "mixture"
               else CurriculumSampler(None, n_samples=IDS.size, total_steps=4, samples_per_step=4, seed=5))  # fmt: skip
    args, says = MISMATCHED[case]
    with pytest.raises(InputError, match=says):
        _trainer(hf_model, tmp_path, sampler, **args).get_train_dataloader()


def test_the_trainer_with_matching_updates_draws_the_samplers_steps(hf_model, tmp_path):
    sampler = mixture_sampler(IDS, _schedule(steps=4), samples_per_step=4, seed=5)
    loader = _trainer(hf_model, tmp_path, sampler, max_steps=4, per_device_train_batch_size=2,
                      gradient_accumulation_steps=2).get_train_dataloader()  # fmt: skip
    got = torch.cat([b["input_ids"][:, 0] for b in loader]).tolist()  # sample i starts with token i
    assert got == np.concatenate([sampler.draws(t) for t in range(4)]).tolist()


def test_the_trainer_refuses_a_sampler_split_by_rank(hf_model, tmp_path):
    # accelerate splits the one sampler's batches between processes: a per-rank sampler under it
    # would be split twice
    ranked = CurriculumSampler(None, n_samples=IDS.size, total_steps=4, samples_per_step=4, seed=5, rank=0, world_size=2)
    with pytest.raises(InputError, match="world_size=1"):
        _trainer(hf_model, tmp_path, ranked, max_steps=4, per_device_train_batch_size=2).get_train_dataloader()


# -- draws that do not follow a distribution, and seeds that share draws --------------------------


@pytest.mark.parametrize("p", [[2.0, 1.0, 1.0, 0.0], [0.6, 0.5, -0.1, 0.0], [0.5, np.nan, 0.5, 0.0]],
                         ids=["not normalised", "negative", "nan"])  # fmt: skip
def test_arm_probabilities_that_are_not_a_distribution_are_refused(p):
    # before: [2, 1, 1, 0] was drawn as [0.38, 0.31, 0.31, 0] (neither it nor its normalisation [0.5, 0.25, 0.25, 0]),
    # the negative entry was drawn as if it were clipped, and NaN said "probabilities sum to zero"
    s = CoupledSampler(np.full(4, 0.25), lambda t: np.asarray(p), samples_per_step=1000, total_steps=3)
    with pytest.raises(InputError, match="at step 1 must be >= 0 and sum to 1"):
        s.draws(1)


@pytest.mark.parametrize("make", [
    lambda seed: CurriculumSampler(None, n_samples=1000, total_steps=3, samples_per_step=8, seed=seed),
    lambda seed: CoupledSampler(np.full(1000, 1e-3), samples_per_step=8, total_steps=3, seed=seed),
    lambda seed: mixture_sampler(IDS, _schedule(steps=3), samples_per_step=8, seed=seed),
], ids=["v1", "coupled", "mixture"])  # fmt: skip
def test_a_seed_that_would_share_another_seeds_draws_is_refused(make):
    # before: seed 2**32 + 5 drew at step 0 exactly what seed 5 draws at step 1
    assert not np.array_equal(make(5).draws(1), make(2**32 - 1).draws(0))
    for seed in (2**32 + 5, 2**64, -1, 1.5, True):
        with pytest.raises(InputError, match="seed must be an int from 0 to 2\\*\\*32 - 1"):
            make(seed)
    with pytest.raises(InputError, match="asked for step 1.5"):
        make(5).draws(1.5)  # before: silently step 1


def test_a_step_count_beyond_the_seed_words_is_refused():
    CurriculumSampler(None, n_samples=10, total_steps=2**32, samples_per_step=2)  # lazily drawn: fine at the bound
    with pytest.raises(InputError, match="total_steps must be at most 2\\*\\*32"):
        CoupledSampler(np.full(10, 0.1), samples_per_step=2, total_steps=2**32 + 1)


# -- domain ids and the pool against the schedule ----------------------------------------------------


@pytest.mark.parametrize("ids, domains", [
    ([0, 1, -1], ["a", "b"]),      # before: -1 silently the last name, 'b'
    ([0, 1, 2], ["a", "b"]),       # before: IndexError
    ([0.0, 1.0, 2.0], None),       # before: TypeError from numpy
    ([[0, 1, 2]], None),
], ids=["negative id with names", "id beyond the names", "float ids", "2-d ids"])  # fmt: skip
def test_domain_ids_that_are_not_indices_are_one_input_error(ids, domains):
    with pytest.raises(InputError, match="domain_ids must be one integer per sample"):
        mixture_sampler(np.asarray(ids), _schedule(), samples_per_step=4, domains=domains)


@pytest.mark.parametrize("ids", [[0, -1], [0.0, 1.0], [[0, 1]], []], ids=["negative", "float", "2-d", "empty"])
def test_domain_probabilities_of_ids_that_are_not_indices_is_one_input_error(ids):
    with pytest.raises(InputError, match="domain ids must be one integer per sample"):
        domain_probabilities(np.asarray(ids), [0.5, 0.5])


def test_a_schedule_domain_missing_from_the_pool_is_named_and_a_zero_base_one_may_be_absent():
    with pytest.raises(InputError, match=r"domain\(s\) \['b'\] have base weight > 0 but no training sample"):
        mixture_sampler(np.array([0, 2, 2]), _schedule(), samples_per_step=4)
    s = mixture_sampler(np.array([0, 2, 2]), _schedule(base=(0.5, 0.0, 0.5)), samples_per_step=4000)
    assert set(np.array([0, 2, 2])[s.draws(3)]) <= {0, 2}
    with pytest.raises(InputError, match=r"domains \['z'\] are not in the schedule's"):
        mixture_sampler(np.array([0, 1]), _schedule(), samples_per_step=4, domains=["a", "z"])


# -- a config of numpy numbers is written as a valid file --------------------------------------------


def test_a_config_of_numpy_numbers_saves_and_loads(tmp_path):
    # before: TypeError "Object of type int64 is not JSON serializable" from save
    cfg = MixtureConfig(total_steps=np.int64(50), floor=np.float32(0.25), temperature=np.float64(2.0), width=np.int64(0))
    sched = MixtureSchedule(_schedule().rates, cfg)
    back = load_mixture_schedule(sched.save(tmp_path / "m.json"))
    plain = MixtureSchedule(_schedule().rates, MixtureConfig(total_steps=50, floor=0.25, temperature=2.0, width=0.0))
    assert np.array_equal(back.table_, plain.table_) and back.config == plain.config
    assert type(back.config.total_steps) is int and type(cfg.floor) is float
    with pytest.raises(InputError, match="floor must be a number"):
        MixtureConfig(total_steps=5, floor="0.3")
