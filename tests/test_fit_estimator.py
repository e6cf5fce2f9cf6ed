"""SigmoidFitter: scikit-learn conventions over fit_sigmoids."""

from __future__ import annotations

import numpy as np
import pytest

from tokdyn.errors import InputError
from tokdyn.fit import SigmoidFitter, fit_sigmoids
from tokdyn.fit.synthetic import plant_sigmoids

X = np.linspace(1.0, 5.0, 40)


def test_init_only_stores():
    f = SigmoidFitter(max_iter=-5, backend="nope")  # invalid, but not checked until fit
    assert f.max_iter == -5 and f.get_params()["backend"] == "nope"
    with pytest.raises(InputError):
        f.fit(X, np.ones((1, 40)))


def test_fit_returns_self_and_matches_function():
    pl = plant_sigmoids(50, X, rng=np.random.default_rng(0))
    f = SigmoidFitter(backend="numpy", vocab_size=1000)
    assert f.fit(X, pl.Y) is f
    ref = fit_sigmoids(X, pl.Y, backend="numpy", vocab_size=1000)
    np.testing.assert_array_equal(f.params_[:, 2], ref.mu)
    np.testing.assert_array_equal(f.se_[:, 3], ref.s_se)
    np.testing.assert_array_equal(f.status_, ref.status)
    np.testing.assert_array_equal(f.class_names_, ref.class_name)
    assert f.params_.shape == (50, 4) and f.predict().shape == (50, 40)
    # predictions are the fitted curves: residuals are the planted noise
    assert np.sqrt(np.mean((f.predict() - pl.Y) ** 2)) == pytest.approx(0.2, abs=0.02)
    assert f.predict(X[:5], two_sigmoids=True).shape == (50, 5)
    assert sum(f.class_loss_share().values()) == pytest.approx(1.0)


def test_one_trajectory_and_params_roundtrip():
    y = plant_sigmoids(1, X, rng=np.random.default_rng(1)).Y[0]
    f = SigmoidFitter(backend="numpy").fit(X, y)
    assert f.params_.shape == (1, 4)
    g = SigmoidFitter(**f.get_params())
    assert g.get_params() == f.get_params()
    g.set_params(delta_min=2.0)
    assert g.get_params()["delta_min"] == 2.0


def test_unfitted_predict_raises():
    with pytest.raises(InputError, match="not fitted"):
        SigmoidFitter().predict()
