"""The training frameworks the recorder's adapters are tested with, imported or the test skipped."""

from __future__ import annotations

import pytest


def hf():
    """transformers, with the accelerate its Trainer needs (else the test is skipped)."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    return pytest.importorskip("transformers")


def lightning():
    """Lightning's ``pytorch`` package, under either of its names (else the test is skipped)."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = pytest.importorskip("pytorch_lightning")
    return pl
