"""What the curriculum's readers share: the pilot run's axis check, domain names, and numbers given
as arrays (:func:`floats`)."""

from __future__ import annotations

from .._checks import as_values
from ..errors import InputError

__all__ = ["require_step_axis", "domain_names"]

_AXIS_WORDS = {"D": "data budget: log10 tokens", "M": "model size: log10 non-embedding parameters"}


def require_step_axis(run, what: str) -> None:
    """Raise :class:`InputError` unless ``run`` (a store's Run) lies on the training-step axis T.

    A curriculum is keyed to the steps of one training run: the learning times of a D or M run
    (one point per data budget or model size) are log10 tokens or parameters, and read as log10
    steps they would put every event decades away from where it belongs.
    """
    axis = getattr(run, "axis", "T")
    if axis != "T":
        raise InputError(f"run {run.name!r} lies on the {axis} axis ({_AXIS_WORDS.get(axis, 'not training steps')}), "
                         f"not on training steps; {what} needs a pilot recorded along one training run (axis T)")  # fmt: skip



def domain_names(domains) -> tuple[str, ...]:
    """``domains`` as one or more distinct names (a schedule's columns are looked up by name)."""
    if isinstance(domains, (str, bytes)) or not hasattr(domains, "__iter__"):  # "ab" is not the domains 'a' and 'b'
        raise InputError(f"domains must be a sequence of domain names, got {domains!r}")
    names = tuple(str(d) for d in domains)
    if not names:
        raise InputError("domains: a mixture needs one domain at least, got none")
    if len(set(names)) != len(names):
        raise InputError(f"domain names must be distinct, got {list(names)}")
    return names


def floats(name: str, values):
    """``values`` as a new float64 array (:func:`tokdyn._checks.as_values`: a masked value, a bool
    or text is refused), or one :class:`InputError` saying ``"{name} must be numbers, got ..."``."""
    return as_values(name, values, lead=f"{name} must be numbers")
