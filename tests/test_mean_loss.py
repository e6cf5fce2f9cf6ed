"""The mean probe loss a reconstruction is measured against, read chunk by chunk from a store."""

from __future__ import annotations

import numpy as np
import pytest

import tokdyn
from tokdyn import reconstruct as rc


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_mean_probe_loss_is_the_mean_of_the_finite_losses(tmp_path, dtype, monkeypatch):
    monkeypatch.setattr(rc, "_MEAN_SLICE", 7)  # slices that do not divide the chunks
    rng = np.random.default_rng(0)
    n, steps = 1000, [0, 1, 2, 5, 9]
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st = tokdyn.open_store(str(tmp_path / "s.zarr"), probe, mode="w")
    w = st.create_run("r", capacity=len(steps), dtype=dtype, token_chunk=300).writer()
    Y = rng.uniform(0.5, 6.0, (len(steps), n)).astype(np.float32)
    Y[1, ::3] = np.nan  # lost tokens
    Y[3] = np.nan  # a row with no finite loss
    for step, row in zip(steps, Y):
        w.append(row, step=step, warn_nonfinite=False)
    r = st.run("r")
    stored = r.losses_at(np.arange(len(steps)), np.arange(n)).astype(np.float64)
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):
        want = np.nanmean(stored, axis=1)  # the all-NaN row warns and gives NaN
    assert r.to_dask().numblocks[1] > 1  # chunk by chunk
    with pytest.warns(rc.MeasuredMeanWarning, match="each row's mean probe loss is over other tokens"):  # said, never silent
        got = rc.mean_probe_loss(r)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert np.isnan(got[3])
    np.testing.assert_allclose(rc.mean_probe_loss(r, np.array([4, 0])), want[[4, 0]], rtol=1e-13)
