"""A scikit-learn-style estimator over :func:`tokdyn.fit.fit_sigmoids`, for arrays in memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from tokdyn.errors import InputError
from tokdyn.fit.block import SigmoidFit, _as_array, _real_dtype, fit_sigmoids
from tokdyn.fit.models import two_sigmoid_curve
from tokdyn.fit.options import FitOptions
from tokdyn.fit.sigmoid import refuse_masked, sigmoid_curve

__all__ = ["SigmoidFitter"]


class SigmoidFitter:
    """Fit one learning event (and the models it is compared with) to each loss trajectory.

    Parameters are those of :class:`FitOptions` plus ``backend``, ``device`` and
    ``block_rows`` (see :func:`fit_sigmoids`). ``__init__`` only stores them; ``fit``
    validates them, in one place (FitOptions).

    Attributes set by ``fit`` (arrays of length B, one per trajectory)
    ------------------------------------------------------------------
    params_ : [B, 4] (l0, linf, mu, s)
    se_ : [B, 4] their standard errors
    status_, class_, model_ : int codes (names in ``status_names_``, ``class_names_``)
    result_ : the full :class:`SigmoidFit` (every :data:`FIT_FIELDS` array)
    x_ : [K] the axis it was fitted on

    Examples
    --------
    >>> fitter = SigmoidFitter(vocab_size=50304).fit(np.log10(steps), losses)  # doctest: +SKIP
    >>> fitter.params_[:, 2]  # learning times mu  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        backend: str = "auto",
        device: Any = None,
        block_rows: int | None = None,
        **options: Any,
    ) -> None:
        self.backend = backend
        self.device = device
        self.block_rows = block_rows
        for name, value in options.items():
            setattr(self, name, value)
        self._option_names = tuple(options)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        params = {"backend": self.backend, "device": self.device, "block_rows": self.block_rows}
        params.update({name: getattr(self, name) for name in self._option_names})
        return params

    def set_params(self, **params: Any) -> SigmoidFitter:
        for name, value in params.items():
            setattr(self, name, value)
            if name not in ("backend", "device", "block_rows") and name not in self._option_names:
                self._option_names += (name,)
        return self

    def _options(self) -> FitOptions:
        return FitOptions.from_kwargs(
            None, **{name: getattr(self, name) for name in self._option_names}
        )

    def fit(self, x: Any, Y: Any) -> SigmoidFitter:
        """Fit every row of Y [B, K] (nats, NaN = missing) on x [K] = log10(axis values).

        A 1-D Y is taken as one trajectory. Returns self.
        """
        # an ndarray as it is (a masked array keeps its mask: masked points are missing);
        # anything else (lists, tensors) converted here, or one InputError (a ragged list)
        Y = Y if isinstance(Y, np.ndarray) else _as_array("Y", Y)
        if Y.ndim == 1:
            Y = Y[None, :]
        result = fit_sigmoids(
            x, Y, backend=self.backend, device=self.device, options=self._options(),
            block_rows=self.block_rows,
        )
        self.result_ = result
        self.x_ = np.asarray(x, dtype=np.float64)
        self.params_ = np.stack([result.l0, result.linf, result.mu, result.s], axis=1)
        self.se_ = np.stack([result.l0_se, result.linf_se, result.mu_se, result.s_se], axis=1)
        self.status_ = result.status
        self.class_ = result.class_code
        self.model_ = result.model
        self.status_names_ = result.status_name
        self.class_names_ = result.class_name
        return self

    def _check_fitted(self) -> SigmoidFit:
        if not hasattr(self, "result_"):
            raise InputError("this SigmoidFitter is not fitted yet: call fit(x, Y) first")
        return self.result_

    def predict(self, x: Any = None, *, two_sigmoids: bool = False) -> np.ndarray:
        """Fitted curves [B, len(x)] at x (default: the x it was fitted on).

        ``two_sigmoids=True`` evaluates the two-sigmoid fit instead of the sigmoid.
        """
        r = self._check_fitted()
        if x is not None:
            refuse_masked(x, "x", "predict at the positions wanted only")  # as fit refuses one
            x = _as_array("x", x)
            if x.ndim != 1:
                raise InputError(f"x: expected a 1-D array, got shape {x.shape}")
            if not _real_dtype(x):
                raise InputError(f"x: expected real numbers, got dtype {x.dtype}")
        x = self.x_ if x is None else x.astype(np.float64)
        if two_sigmoids:
            p = [r.linf2, r.delta1, r.mu1, r.s1, r.delta2, r.mu2, r.s2]
            return two_sigmoid_curve(x[None, :], *(a[:, None] for a in p))
        return sigmoid_curve(x[None, :], *(a[:, None] for a in (r.l0, r.linf, r.mu, r.s)))

    def class_loss_share(self) -> dict[str, float]:
        """Each class's share of the total loss drop."""
        return self._check_fitted().class_loss_share()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"SigmoidFitter({args})"

