"""Hunt 25: trainings that go wrong, end to end: a model whose weights turn NaN at a step (every
later checkpoint's loss NaN), tokens whose loss turns NaN or inf at some rows, losses of 1e4 nats,
and what `tokdyn fit` says of them."""

from __future__ import annotations

import json
from pathlib import Path
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import tokdyn
from tokdyn.cli import main

STEPS = np.unique(np.geomspace(1, 10_000, 25).astype(int))  # 24 steps, 1..10,000


def planted(path, Y: np.ndarray, *, dtype: str = "float32", domains: tuple = ()) -> tokdyn.TrajectoryStore:
    """A store of one run 'r' with losses ``Y`` [tokens, len(STEPS)], NaN and inf kept as given;
    with ``domains``, its sequences of 8 tokens split among them in order, in equal parts."""
    tokens = np.random.default_rng(0).integers(0, 257, size=(Y.shape[0] // 8, 9))
    split = {} if not domains else {"domains": domains, "domain": np.repeat(np.arange(len(domains)), len(tokens) // len(domains))}
    probe = tokdyn.ProbeSet.from_tokens(tokens, tokenizer={"kind": "byte", "vocab_size": 257}, **split)
    st = tokdyn.open_store(str(path), probe, mode="w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the writer's "non-finite losses stored as NaN"
        with st.create_run("r", capacity=len(STEPS), dtype=dtype).writer() as w:
            for j, step in enumerate(STEPS):
                w.append(Y[:, j], step=int(step))
    return st


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """The CLI run in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(argv)
    got = capsys.readouterr()
    return code, got.out, got.err


def learning(n: int, seed: int = 0) -> np.ndarray:
    """[n, len(STEPS)] tokens that each learn once (a sigmoid fall of 1-3 nats), with noise."""
    rng = np.random.default_rng(seed)
    x = np.log10(STEPS)
    mu, d = rng.uniform(0.8, 3.2, n), rng.uniform(1, 3, n)
    return 1 + d[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / 0.15)) + rng.normal(0, 0.03, (n, x.size))


def test_a_fit_of_a_run_that_diverged_says_the_rows_with_no_loss(tmp_path, capsys):
    """The model's weights turned NaN after step 2,000: every token's loss at the last 5 of 24
    checkpoints is NaN. `tokdyn fit` said "64 tokens on 24 points" and "learned 64 (100.0%)",
    not a word that a fifth of the points held no loss at all (the spectrum and the report
    warned, the fit, read first, did not); its --json had nothing to tell either."""
    Y = learning(64)
    Y[:, -5:] = np.nan
    planted(tmp_path / "s.zarr", Y)
    code, out, err = run_cli(["fit", str(tmp_path / "s.zarr"), "--no-progress"], capsys)
    assert code == 0, err
    lo, hi = STEPS[-5], STEPS[-1]
    assert f"no loss: the last 5 of the 24 points (steps {lo:g}-{hi:g}) hold no token's loss" in out, out
    assert "the classes are of the other 19" in out and "missing:" not in out  # no token misses another point
    code, out, _ = run_cli(["fit", str(tmp_path / "s.zarr"), "--json"], capsys)
    got = json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    assert got["n_rows_without_loss"] == 5 and got["n_tokens_missing_points"] == 0
    assert got["missing_losses"].startswith("no loss: the last 5 of the 24 points")


def test_a_fit_says_the_tokens_fitted_on_fewer_points(tmp_path, capsys):
    """Tokens whose loss turned NaN or inf (stored as NaN) at some checkpoints were fitted on the
    others and classed like every other token: `learned`, without a word of how many tokens,
    or how many of their losses, the classes were made without."""
    Y = learning(64)
    Y[:10, 15:] = np.nan  # 10 tokens lose their last 9 points
    Y[10:13, 3] = np.inf  # 3 tokens lose one point
    planted(tmp_path / "s.zarr", Y)
    code, out, err = run_cli(["fit", str(tmp_path / "s.zarr"), "--no-progress"], capsys)
    assert code == 0, err
    assert "missing: 13 of the 64 tokens have no loss at some of the 24 points (93 losses NaN or inf)" in out, out
    assert "no loss:" not in out  # no row is empty


def test_a_fit_of_a_run_with_every_loss_says_nothing_of_missing(tmp_path, capsys):
    planted(tmp_path / "s.zarr", learning(64))
    code, out, err = run_cli(["fit", str(tmp_path / "s.zarr"), "--no-progress"], capsys)
    assert code == 0 and "missing" not in out and "no loss" not in out, out
    assert tokdyn.fit_run(tokdyn.open_store(str(tmp_path / "s.zarr"), mode="r+").run("r"), progress=False).missing_losses is None


@given(hst.lists(hst.integers(0, 10), min_size=8, max_size=8), hst.sets(hst.integers(0, 9), max_size=10),
       hst.booleans())
@settings(max_examples=60, deadline=None)
def test_missing_losses_counts_against_a_count_by_hand(lost, empty_rows, padding):
    """Each token ``i`` misses ``lost[i]`` of 10 points (a missing point is a NaN in its row),
    rows in ``empty_rows`` hold no loss at all; the counts are those of the losses, by hand."""
    from tokdyn.fit.job import missing_losses  # new in hunt 25: imported here, so the tests above run on the code before it

    K, n = 10, len(lost)
    Y = np.ones((K, n))
    for i, k in enumerate(lost):
        Y[K - k:, i] = np.nan
    Y[sorted(empty_rows), :] = np.nan
    if padding:
        Y[:, 0] = np.nan  # a padding token: no loss anywhere, not "missing" points
    n_points = np.isfinite(Y).sum(axis=0)
    per_row = {r: int(np.isnan(Y[r]).sum()) for r in range(K) if np.isnan(Y[r]).any()}
    line, n_empty, n_missing = missing_losses(np.arange(1, K + 1) * 10.0, "T", np.arange(K), n_points, per_row, n)
    want_empty = sum(1 for r in range(K) if np.isnan(Y[r]).all())
    assert n_empty == want_empty
    short = (n_points > 0) & (n_points < K - want_empty)  # beyond the empty rows
    assert n_missing == int(np.count_nonzero(short))
    assert (line is None) == (want_empty == 0 and n_missing == 0)
    if n_missing:
        assert f"({int((K - want_empty - n_points[short]).sum()):,} losses NaN or inf)" in line
    if want_empty:
        assert f"{want_empty:,} of the {K} points" in line


def test_a_token_whose_every_loss_was_inf_is_not_called_padding_alone(tmp_path, capsys):
    """A target whose logit is masked to -inf has an infinite loss at every checkpoint (stored as
    NaN, as padding is): `tokdyn fit` said "8 of the 64 probe tokens with no recorded loss
    (padding, or never recorded)", a cause those tokens do not have."""
    Y = learning(64)
    Y[:8] = np.inf
    planted(tmp_path / "s.zarr", Y)
    code, out, err = run_cli(["fit", str(tmp_path / "s.zarr"), "--no-progress"], capsys)
    assert code == 0, err
    assert "8 of the 64 probe tokens with no recorded loss (padding, never recorded, or NaN or inf at every point)" in out, out
    assert "missing:" not in out  # no observed token misses a point


def test_the_spectrum_json_of_a_refused_interval_is_what_the_docs_say(tmp_path, capsys):
    """docs/spectrum.md said a refused interval is `"alpha_ci95": [NaN, NaN]` in the JSON: a
    reader written to that (NaN is no JSON) met `[null, null]`."""
    Y = learning(64)
    Y[:8, 12:] = 1e3  # 8 tokens blow up: the spectrum goes negative past x 1.8
    planted(tmp_path / "s.zarr", Y)
    assert run_cli(["fit", str(tmp_path / "s.zarr"), "--no-progress"], capsys)[0] == 0
    code, out, err = run_cli(["spectrum", str(tmp_path / "s.zarr"), "--json"], capsys)
    assert code == 0, err
    got = json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    law = got["spectrum_power_law"]
    assert law["alpha_ci95"] == [None, None] and law["alpha_ci95_why"], law  # 8 windows: no interval
    docs = (Path(__file__).parents[1] / "docs" / "spectrum.md").read_text()
    assert "`alpha_ci95` is `[null, null]`" in docs and "[NaN, NaN]" not in docs


def test_spectrum_by_domain_says_a_domain_whose_every_loss_was_nan(tmp_path, capsys):
    """The prose half of the probe diverged from the start (every loss NaN): `tokdyn spectrum
    --by domain` listed `code` alone, prose in no line (not even the small groups'), and its JSON
    had no trace of it."""
    Y = learning(128)
    Y[64:] = np.nan
    planted(tmp_path / "s.zarr", Y, domains=("code", "prose"))
    assert run_cli(["fit", str(tmp_path / "s.zarr"), "--no-progress"], capsys)[0] == 0
    code, out, err = run_cli(["spectrum", str(tmp_path / "s.zarr"), "--by", "domain"], capsys)
    assert code == 0, err
    assert "  no events in 1 domain (no fitted step in its tokens' losses, or no loss at all): prose" in out, out
    code, out, err = run_cli(["spectrum", str(tmp_path / "s.zarr"), "--by", "domain", "--json"], capsys)
    assert json.loads(out)["no_events"] == ["prose"] and list(json.loads(out)["groups"]) == ["code"]
    Y[64:] = learning(64, seed=1)  # both domains learn: no such line
    planted(tmp_path / "t.zarr", Y, domains=("code", "prose"))
    assert run_cli(["fit", str(tmp_path / "t.zarr"), "--no-progress"], capsys)[0] == 0
    code, out, err = run_cli(["spectrum", str(tmp_path / "t.zarr"), "--by", "domain"], capsys)
    assert code == 0 and "no events" not in out and "  prose " in out, out


def test_compare_gives_a_row_to_a_domain_with_no_token_compared(tmp_path, capsys):
    """The prose half of run 'r' diverged from the start (every loss NaN); `tokdyn compare` had
    rows for `all`, `class learned` and `domain code`, and none for prose: a domain that had
    nothing to compare read as one the probe does not have. It is a row of 0 now (text and JSON)."""
    Y = learning(128)
    Y[64:] = np.nan
    st = planted(tmp_path / "s.zarr", Y, domains=("code", "prose"))
    with st.create_run("r2", capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            w.append(learning(128, seed=2)[:, j], step=int(step))
    for run in ("r", "r2"):
        tokdyn.fit_run(st.run(run), progress=False)
    code, out, err = run_cli(["compare", str(tmp_path / "s.zarr"), "--run", "r", "--run", "r2"], capsys)
    assert code == 0, err
    assert "  domain prose                   0   (no token of it learned in both runs and compared)" in out, out
    code, out, err = run_cli(["compare", str(tmp_path / "s.zarr"), "--run", "r", "--run", "r2", "--json"], capsys)
    by = json.loads(out)["by_domain"]
    assert list(by) == ["code", "prose"] and by["prose"] == {"n_tokens": 0} and by["code"]["n_tokens"] > 0
