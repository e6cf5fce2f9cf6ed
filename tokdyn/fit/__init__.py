"""Fit learning events to token-loss trajectories (docs/method.md, "The learning event of one token").

For a block of trajectories Y [B, K] on x = log10(axis values) [K], fit per token a sigmoid
(learning time mu, width s, loss drop delta), compare it with a constant, a line and two
sigmoids by BIC, and give each token a class. Start with :func:`fit_sigmoids` (arrays in
memory), :class:`SigmoidFitter` (scikit-learn style) or :func:`fit_block` (one block, a
fixed record of fields, for stores). docs/fitting.md describes the algorithm and choices.
"""

from tokdyn._lazy import lazy_names
from tokdyn.fit.backends import available_backends
from tokdyn.fit.block import FIT_FIELDS, SigmoidFit, fit_block, fit_sigmoids
from tokdyn.fit.estimator import SigmoidFitter
from tokdyn.fit.models import class_loss_share, classify
from tokdyn.fit.options import (
    CLASS_CODES,
    CLASS_NAMES,
    MODEL_NAMES,
    STATUS_CODES,
    STATUS_NAMES,
    FitOptions,
)
from tokdyn.fit.sigmoid import age_of_acquisition, log_axis, sigmoid_curve

__all__ = [
    "fit_sigmoids",
    "fit_run",
    "FitSummary",
    "fit_inputs",
    "fitted_inputs",
    "read_fit",
    "stored_options",
    "fit_block",
    "FIT_FIELDS",
    "SigmoidFit",
    "SigmoidFitter",
    "FitOptions",
    "classify",
    "class_loss_share",
    "STATUS_CODES",
    "STATUS_NAMES",
    "CLASS_CODES",
    "CLASS_NAMES",
    "MODEL_NAMES",
    "age_of_acquisition",
    "sigmoid_curve",
    "log_axis",
    "available_backends",
]

# Fitting a store (tokdyn.fit.job: zarr, dask) loads on first use: fitting arrays in memory
# needs neither (a GPU machine with torch alone runs fit_sigmoids).
__getattr__ = lazy_names(__name__, dict.fromkeys(
    ["FitSummary", "fit_inputs", "fit_run", "fitted_inputs", "read_fit", "stored_options"], "job"))
