"""`tokdyn compare` and `tokdyn export-npz` on a large run: what they read, and that reading less
changes nothing they give.

compare reads the event fields of each fit a slice of tokens at a time (it read all 39 fields of
both fits at once: 2.6 GB on 2,000,000 tokens); export-npz streams the loss matrix into the file
a token chunk at a time (it held the whole matrix, and its transpose: 3.4 GB). Each result is
checked against an independent route on small stores: the whole fit's events, and ``np.savez``
of the arrays the file must hold.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile

import numpy as np
import pytest

import tokdyn
import tokdyn.compare as compare
import tokdyn.interchange as interchange
from tokdyn.cli import main
from tokdyn.compare import compare_runs, token_times
from tokdyn.errors import StoreError
from tokdyn.fit.job import fit_run
from tokdyn.interchange import export_npz, import_npz
from tokdyn.store import FitResults, Run

STEPS = np.unique(np.round(np.geomspace(10, 100_000, 30)).astype(np.int64))
S, C = 90, 10  # 900 tokens; fit blocks and loss chunks of 100 tokens
CHUNK = 100
NEVER = slice(200, 300)  # a whole chunk of tokens never scored (an unfit fit block)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two fitted runs of one probe (token ids, 3 domains): B learns 0.4 decades earlier and was
    recorded over a shorter range (compared over the range both observed); one chunk of tokens
    is never scored in either."""
    rng = np.random.default_rng(3)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 257, (S, C + 1)), domain=rng.integers(0, 3, S),
                                        domains=("code", "prose", "math"), documents=["a.txt"],
                                        tokenizer={"kind": "byte", "vocab_size": 257, "eot_id": 256})  # fmt: skip
    n = probe.n_tokens
    x = np.log10(STEPS.astype(float))
    st = tokdyn.open_store(tmp_path_factory.mktemp("scale") / "s.zarr", probe, mode="w")
    for name, shift, k in (("A", 0.0, len(STEPS)), ("B", -0.4, len(STEPS) - 5)):
        mu, s, d = rng.uniform(1.5, 4.5, n) + shift, rng.uniform(0.05, 0.4, n), rng.uniform(0.5, 4.0, n)
        with st.create_run(name, capacity=k, dtype="float16", token_chunk=CHUNK).writer() as w:
            for j in range(k):
                row = 1 + d / (1 + np.exp((x[j] - mu) / s)) + 0.1 * rng.standard_normal(n)
                row[NEVER] = np.nan
                row[rng.random(n) < 0.01] = np.nan
                w.append(row.astype(np.float32), step=int(STEPS[j]), warn_nonfinite=False)
        fit_run(st.run(name), progress=False)
    return st


# -- compare -----------------------------------------------------------------------------------


def _reference(st, run_a: str, run_b: str, tol: float) -> dict:
    """compare's result by the whole-fit route: every field of both fits read at once, their
    events (tokdyn.spectrum.run_events), each token's learning time in the common range, the
    share of its falling drop in the run's own range that the common range shows (censored
    below WHOLE_SHARE in either run), and the summaries computed here."""
    from tokdyn.fit.options import CLASS_NAMES
    from tokdyn.spectrum import run_events

    runs = [st.run(run_a), st.run(run_b)]
    fits = [r.fit.read() for r in runs]
    evs = [run_events(r, fit=f) for r, f in zip(runs, fits)]
    common = (max(e.x_range[0] for e in evs), min(e.x_range[1] for e in evs))

    def times(own, fit):
        ev = dataclasses.replace(own, x_range=common)
        n = ev.n_tokens
        seen = ev.realized_drop()
        drop = np.bincount(ev.token, weights=seen, minlength=n)
        w = np.clip(seen, 0, None)
        wsum = np.bincount(ev.token, weights=w, minlength=n)
        wmu = np.bincount(ev.token, weights=w * ev.seen_centre(), minlength=n)
        learned = (drop > 0) & (wsum > 0) & (fit["model"] >= 2)  # a sigmoid or two chosen: a step
        mu = np.divide(wmu, wsum, out=np.full(n, np.nan), where=learned)
        names = np.array([CLASS_NAMES.get(c, "?") for c in range(max(CLASS_NAMES) + 1)])
        falls = ev.delta > 0
        here = np.bincount(ev.token, weights=seen * falls, minlength=n)
        there = np.bincount(own.token, weights=own.realized_drop() * falls, minlength=n)
        cut = learned & (here < compare.WHOLE_SHARE * there)
        return mu, np.where(learned, drop, 0.0), names[np.clip(fit["class_code"].astype(int), 0, names.size - 1)], cut

    (mu_a, drop_a, klass, cut_a), (mu_b, _, _, cut_b) = times(evs[0], fits[0]), times(evs[1], fits[1])
    probe = st.probe
    domain = np.array(list(probe.domains))[probe.token_arrays["domain"]]
    learned = np.isfinite(mu_a) & np.isfinite(mu_b)
    both = learned & ~cut_a & ~cut_b
    censored = learned & (cut_a | cut_b)
    shift, drop = (mu_b - mu_a)[both], drop_a[both]

    def summary(sh, dr):
        q = np.quantile(sh, [0.25, 0.5, 0.75])
        total = dr.sum()
        return {"n_tokens": int(sh.size), "median_shift": float(q[1]), "q25": float(q[0]), "q75": float(q[2]),
                "mean_shift": float(sh.mean()), "share_earlier": float((sh < 0).mean()),
                "drop_share_earlier": float(dr[sh < -tol].sum() / total), "drop_share_later": float(dr[sh > tol].sum() / total)}  # fmt: skip

    counts, edges = np.histogram(shift, bins=40)
    out = {"run_a": run_a, "run_b": run_b, "axis": "T", "tolerance": tol, "n_probe_tokens": int(mu_a.size),
           "x_range": list(common), "x_ranges": {run_a: list(evs[0].x_range), run_b: list(evs[1].x_range)}, "has_domains": True,
           "n_learned": {run_a: int(np.isfinite(mu_a).sum()), run_b: int(np.isfinite(mu_b).sum())},
           "censored": {"n_tokens": int(censored.sum()), "drop_share": float(drop_a[censored].sum() / drop_a[learned].sum()),
                        "cut_in": {run_a: int((learned & cut_a).sum()), run_b: int((learned & cut_b).sum())}, "whole_share": compare.WHOLE_SHARE},
           "overall": summary(shift, drop), "by_class": {}, "by_domain": {},
           "histogram": {"counts": counts.tolist(), "edges": edges.tolist()}}  # fmt: skip
    for key, labels in (("by_class", klass[both]), ("by_domain", domain[both])):
        for lab in sorted(set(labels.tolist())):
            out[key][lab] = summary(shift[labels == lab], drop[labels == lab])
    return out


@pytest.mark.parametrize("slice_tokens", [1, 150, 250, 100_000])  # a fit block a slice, two, three, all at once
def test_compare_gives_what_the_whole_fit_gives(two_runs, monkeypatch, slice_tokens):
    """Bit for bit, whatever the slice: each token's events summed in the same order, and the
    never-scored block (a slice of unfit tokens, which events_from_fit alone refuses) carries none."""
    monkeypatch.setattr(compare, "SLICE_TOKENS", slice_tokens, raising=False)
    st = two_runs
    ref = _reference(st, "A", "B", 0.05)
    assert ref["x_ranges"]["A"] != ref["x_ranges"]["B"] and set(ref["by_domain"]) == {"code", "prose", "math"}
    assert len(ref["by_class"]) >= 2
    assert json.dumps(compare_runs(st, "A", "B")) == json.dumps(ref)
    assert json.dumps(compare_runs(st, "B", "A", tolerance=0.2)) == json.dumps(_reference(st, "B", "A", 0.2))


def test_compare_cli_prints_the_same_numbers(two_runs, capsys):
    st = two_runs
    assert main(["compare", str(st.url), "--run", "A", "--run", "B", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(_reference(st, "A", "B", 0.05)))


def test_token_times_are_the_whole_fits(two_runs, monkeypatch):
    from tokdyn.spectrum import run_events

    monkeypatch.setattr(compare, "SLICE_TOKENS", 150, raising=False)
    st = two_runs
    r = st.run("A")
    ev = run_events(r)
    t = token_times(st, "A")
    seen = ev.realized_drop()
    drop = np.bincount(ev.token, weights=seen, minlength=ev.n_tokens)
    wsum = np.bincount(ev.token, weights=np.clip(seen, 0, None), minlength=ev.n_tokens)
    learned = (drop > 0) & (wsum > 0) & (r.fit.read(["model"])["model"] >= 2)
    assert np.array_equal(t.drop, np.where(learned, drop, 0.0))
    assert np.isnan(t.mu[NEVER]).all() and (t.drop[NEVER] == 0).all()
    assert t.domain.tolist() == np.array(["code", "prose", "math"])[st.probe.token_arrays["domain"]].tolist()
    assert t.klass.dtype.kind == "U" and t.axis == "T"
    narrower = token_times(st, "A", x_range=(1.5, 3.5))
    assert np.nanmax(narrower.mu) <= 3.5 and not np.array_equal(narrower.mu, t.mu, equal_nan=True)


def test_compare_reads_the_event_fields_a_slice_at_a_time(two_runs, monkeypatch):
    """The defect: every field of both fits (39) read whole, at once. Now two whole fields (the
    observed range) and 17 a slice at a time."""
    monkeypatch.setattr(compare, "SLICE_TOKENS", 200, raising=False)
    whole, sliced = [], []
    read, read_tokens = FitResults.read, getattr(FitResults, "read_tokens", None)

    def spy_read(self, fields=None, **kw):
        whole.append(None if fields is None else tuple(fields))
        return read(self, fields, **kw)

    def spy_tokens(self, start, stop, fields=None, **kw):
        sliced.append((stop - start, None if fields is None else tuple(fields)))
        return read_tokens(self, start, stop, fields, **kw)

    monkeypatch.setattr(FitResults, "read", spy_read)
    monkeypatch.setattr(FitResults, "read_tokens", spy_tokens, raising=False)
    compare_runs(two_runs, "A", "B")
    assert whole == [("x_first", "x_last")] * 2
    assert sliced and all(size <= 200 and fields == compare._FIELDS for size, fields in sliced)
    assert len(compare._FIELDS) == 17 and sum(size for size, _ in sliced) == 2 * two_runs.probe.n_tokens


def test_read_tokens_checks_the_blocks_it_reads(two_runs):
    fit = two_runs.run("A").fit
    full = fit.read(["mu", "class_code"])
    for a, b in ((0, 900), (150, 420), (199, 201), (300, 300), (899, 900)):
        part = fit.read_tokens(a, b, ["mu", "class_code"])
        assert part["class_code"].dtype == full["class_code"].dtype
        for key in part:
            assert np.array_equal(part[key], full[key][a:b], equal_nan=True)
    with pytest.raises(tokdyn.errors.InputError, match="must lie in"):
        fit.read_tokens(10, 901)
    with pytest.raises(tokdyn.errors.InputError, match="unknown fit fields"):
        fit.read_tokens(0, 10, ["nope"])


# -- export-npz --------------------------------------------------------------------------------


def _members(path) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def _expected_npz(run: Run, path) -> None:
    """What export-npz must write, by np.savez of arrays built here: the committed rows
    transposed to [tokens, rows] (float16 widened to float32), the axis, the probe's fields."""
    probe = run.store.probe
    losses = run.losses()
    if losses.dtype == np.float16:
        losses = losses.astype(np.float32)
    np.savez(path, axis_values=run.axis_values, loss_matrix=np.ascontiguousarray(losses.T), axis_name=np.array([run.axis]),
             **probe.token_arrays, probe_tokens=probe.tokens, probe_domains=np.array(probe.domains, dtype=str),
             probe_documents=np.array(probe.documents, dtype=str),
             probe_tokenizer=np.array([json.dumps(probe.tokenizer, sort_keys=True)]))  # fmt: skip


@pytest.mark.parametrize("export_tokens", [7, 100_000])
def test_export_writes_what_savez_writes(two_runs, tmp_path, monkeypatch, export_tokens):
    monkeypatch.setattr(interchange, "EXPORT_TOKENS", export_tokens, raising=False)
    run = two_runs.run("B")
    export_npz(run, tmp_path / "b.npz")
    _expected_npz(run, tmp_path / "want.npz")
    assert _members(tmp_path / "b.npz") == _members(tmp_path / "want.npz")  # members, their order, their bytes
    with np.load(tmp_path / "b.npz", allow_pickle=False) as z:
        assert z["loss_matrix"].shape == (900, len(STEPS) - 5) and z["loss_matrix"].dtype == np.float32
        assert np.isnan(z["loss_matrix"][NEVER]).all()


def test_an_imported_file_exports_as_it_came(tmp_path, monkeypatch):
    """Big-endian losses, integer steps, a bytes axis name: every member bit for bit."""
    monkeypatch.setattr(interchange, "EXPORT_TOKENS", 64, raising=False)
    rng = np.random.default_rng(0)
    lm = rng.gamma(2.0, 1.0, (1000, 5)).astype(">f4")
    lm[5, 2] = np.nan
    np.savez(tmp_path / "in.npz", axis_values=np.array([1, 2, 4, 8, 16], ">i8"), loss_matrix=lm, axis_name=np.array([b"T"]),
             sample_id=np.arange(1000, dtype=">i4"), token_pos=np.ones(1000, "u2"))  # fmt: skip
    run = import_npz(tmp_path / "in.npz", tmp_path / "s.zarr", run="r")
    export_npz(run, tmp_path / "out.npz")
    assert _members(tmp_path / "out.npz") == _members(tmp_path / "in.npz")
    back = import_npz(tmp_path / "out.npz", tmp_path / "s.zarr", run="again")
    assert np.array_equal(back.losses(), run.losses(), equal_nan=True)


def test_export_reads_the_loss_matrix_a_token_chunk_at_a_time(two_runs, tmp_path, monkeypatch):
    """The defect: the whole matrix read at once (then a transposed copy of it)."""
    monkeypatch.setattr(interchange, "EXPORT_TOKENS", 30, raising=False)
    losses, shapes = Run.losses, []

    def spy(self, tokens=None, rows=None):
        out = losses(self, tokens=tokens, rows=rows)
        shapes.append(out.shape)
        return out

    monkeypatch.setattr(Run, "losses", spy)
    export_npz(two_runs.run("A"), tmp_path / "a.npz")
    assert len(shapes) == 9 and all(s == (len(STEPS), CHUNK) for s in shapes)


def test_a_failed_export_leaves_the_old_file_and_no_partial_one(two_runs, tmp_path, monkeypatch, capsys):
    """A chunk that cannot be read half-way through the matrix: one line, exit 1, the file that
    was there untouched, no temporary file left beside it."""
    out = tmp_path / "a.npz"
    out.write_bytes(b"the previous export")
    losses, calls = Run.losses, []

    def failing(self, tokens=None, rows=None):
        calls.append(tokens)
        if len(calls) == 3:
            raise StoreError("run 'A': loss chunk (row 0, token chunk 2) does not hold the values committed there")
        return losses(self, tokens=tokens, rows=rows)

    monkeypatch.setattr(Run, "losses", failing)
    code = main(["export-npz", str(two_runs.url), str(out), "--run", "A"])
    err = capsys.readouterr().err
    assert code == 1 and "token chunk 2" in err and "Traceback" not in err and err.count("\n") == 1
    assert out.read_bytes() == b"the previous export"
    assert os.listdir(tmp_path) == ["a.npz"]


def test_a_swapped_fit_chunk_is_one_line(two_runs, tmp_path, capsys):
    """Reading a slice still checks each fit block against its committed checksum."""
    import shutil

    url = tmp_path / "s.zarr"
    shutil.copytree(str(two_runs.url), url)
    chunks = url / "runs" / "B" / "fit" / "mu" / "c"
    shutil.copyfile(chunks / "0", chunks / "4")  # block 0's results where block 4's belong
    code = main(["compare", str(url), "--run", "A", "--run", "B"])
    err = capsys.readouterr().err
    assert code == 1 and "chunk 4 of fit/mu" in err and "Traceback" not in err and err.count("\n") == 1
