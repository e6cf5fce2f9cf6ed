"""docs/curriculum.md, checked as written (hunt 9)."""

import numpy as np
import pytest

from tokdyn.curriculum import CoupledSampler
from tokdyn.errors import InputError


def test_coupled_sampler_takes_fixed_probabilities_as_an_array():
    # the docs write CoupledSampler(base, probabilities, ...) and "[2, 1, 1, 0] over a uniform p0":
    # an array used to fail deep inside with "TypeError: 'numpy.ndarray' object is not callable"
    p0 = np.full(4, 0.25)
    p = np.array([0.5, 0.25, 0.25, 0.0])
    fixed = CoupledSampler(p0, p, samples_per_step=64, total_steps=3, seed=7)
    called = CoupledSampler(p0, lambda step: p, samples_per_step=64, total_steps=3, seed=7)
    for t in range(3):
        assert np.array_equal(fixed.draws(t), called.draws(t))
    assert not np.isin(fixed.draws(0), [3]).any()
    # a state saved with other fixed probabilities is refused
    other = CoupledSampler(p0, np.array([0.25, 0.5, 0.25, 0.0]), samples_per_step=64, total_steps=3, seed=7)
    with pytest.raises(InputError):
        other.load_state_dict(fixed.state_dict())
    other_same = CoupledSampler(p0, p.copy(), samples_per_step=64, total_steps=3, seed=7)
    other_same.load_state_dict(fixed.state_dict())


def test_coupled_sampler_checks_fixed_probabilities_up_front():
    p0 = np.full(4, 0.25)
    with pytest.raises(InputError, match="sum to 1"):
        CoupledSampler(p0, np.array([2.0, 1.0, 1.0, 0.0]), samples_per_step=4, total_steps=3)
    with pytest.raises(InputError, match="shape"):
        CoupledSampler(p0, np.full(3, 1 / 3), samples_per_step=4, total_steps=3)
    with pytest.raises(InputError, match="callable"):
        CoupledSampler(p0, "uniform", samples_per_step=4, total_steps=3)
