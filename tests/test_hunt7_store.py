"""Hunt 7: the store and the interchange layer as researchers and other programs meet them.

Each test is one class of defect found by driving `tokdyn info`, `import-npz`, `export-npz` and
the store's Python API with unusual but legitimate input; each failed on the code before its
fix (docs/reliability.md, "Store and interchange, hunt 7"):

- a run named like one of zarr's temporary files (``x.partial``) was written and never listed;
- a ``file://`` store URL could not be created (and was written without atomic commits);
- `tokdyn info` crashed on a parameter count that is not an integer;
- ``--dtype float16`` turned finite losses beyond 65504 into NaN without a word;
- row values the arrays cannot hold were truncated (step 1.7 stored as 1) or rounded (step
  2**53 + 1 as axis value 2**53), or escaped as OverflowError; non-increasing axis values were
  accepted, then refused by the fit and by import-npz of the run's own export;
- importing into an existing store dropped what the file carried that the store's probe lacks
  (per-token arrays, token ids, tokenizer) without a word, and took a file whose token ids lay
  the tokens out differently;
- ``Run.losses(rows=slice(None, None, -1))`` read nothing, and other reversed row slices were
  reported as damaged chunks;
- two processes creating the same run at once: zarr's ``ContainsGroupError`` (an internal error).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn.cli import main
from tokdyn.errors import InputError, ProbeMismatchError, RunBusyError, StepOrderError
from tokdyn.interchange import export_npz, import_npz

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])  # fmt: skip


def _npz(path, *, n=4, k=3, lm=None, ax=None, axis="T", **extra):
    lm = np.arange(n * k, dtype=np.float32).reshape(n, k) / 7 if lm is None else lm
    ax = np.arange(1, lm.shape[1] + 1) * 10 if ax is None else ax
    np.savez(path, axis_values=ax, loss_matrix=lm, axis_name=np.array([axis]), **extra)
    return str(path)


def _one_error_line(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "internal error" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 257, size=(2, 5)), tokenizer={"kind": "byte", "vocab_size": 257})
    return tokdyn.open_store(str(tmp_path / "s.zarr"), probe, mode="a")


# -- run names: every name accepted is a name every reader lists ------------------------------

@pytest.mark.parametrize("name", ["x.partial", "zarr.json", "a.0123456789abcdef0123456789abcdef.partial", "two\nlines", " ", "tab\t",
                                  "a" * 256, "é" * 128])  # fmt: skip
def test_a_run_name_no_reader_would_list_is_refused(store, tmp_path, capsys, name):
    with pytest.raises(InputError, match="run name"):
        store.create_run(name)
    code = main(["import-npz", _npz(tmp_path / "a.npz"), str(tmp_path / "s.zarr"), "--run", name])
    assert "name" in _one_error_line(capsys, code)
    assert tokdyn.open_store(str(tmp_path / "s.zarr"), mode="r").runs == []


def test_a_run_name_of_255_bytes_is_a_run(store):
    # past 255 bytes the disk said "File name too long" (an OSError from deep in zarr); at 255 a run
    for name in ("a" * 255, "é" * 127 + "a"):
        with store.create_run(name).writer() as w:
            w.append(np.ones(8, np.float32), step=1)
        assert name in tokdyn.open_store(store.url, mode="r").runs


@FAST
@given(name=st.text(st.characters(codec="utf-8"), min_size=1, max_size=12))
def test_every_run_name_accepted_is_listed_and_read_back(store, name):
    try:
        r = store.create_run(name)
    except InputError:
        return
    with r.writer() as w:
        w.append(np.ones(8, np.float32), step=1)
    again = tokdyn.open_store(store.url, mode="r")
    assert name in again.runs and again.run(name).n_committed == 1
    assert name in again.info()["runs"]
    store.delete_run(name)


# -- store URLs -----------------------------------------------------------------------------

def test_a_file_url_store_is_made_and_written_as_its_path(tmp_path, capsys):
    path = tmp_path / "with space é" / "s.zarr"
    path.parent.mkdir()
    f = _npz(tmp_path / "a.npz")
    assert main(["import-npz", f, f"file://{path}"]) == 0, capsys.readouterr().err
    assert main(["import-npz", f, f"file://{path}", "--run", "b"]) == 0, capsys.readouterr().err
    st_ = tokdyn.open_store(f"file://{path}", mode="r")
    assert isinstance(st_._group.store, tokdyn.store.store.zarr.storage.LocalStore)  # commits by temp file + rename
    assert tokdyn.open_store(str(path), mode="r").runs == ["a", "b"]
    np.testing.assert_array_equal(st_.run("b").losses(), np.load(f)["loss_matrix"].T)


# -- info -----------------------------------------------------------------------------------

@pytest.mark.parametrize("count, shown", [(12345678, "12,345,678"), (1.5e6, "1,500,000"), ("70M", "70M"), ({"emb": 1}, "{'emb': 1}"),
                                           (2.5, "2.5")])  # fmt: skip
def test_info_shows_any_parameter_count_a_run_carries(store, tmp_path, capsys, count, shown):
    r = store.create_run("r", attrs={"n_params_non_embedding": count})
    with r.writer() as w:
        w.append(np.ones(8, np.float32), step=1)
    assert main(["info", store.url]) == 0, capsys.readouterr().err
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("run r")]
    assert line and f"{shown} non-emb params" in line[0]


# -- a narrower --dtype ----------------------------------------------------------------------

@FAST
@given(values=st.lists(st.floats(-1e6, 1e6, width=32) | st.just(float("nan")) | st.just(float("inf")), min_size=6, max_size=6),
       dtype=st.sampled_from(["<f4", "<f8"]))  # fmt: skip
def test_finite_losses_the_stored_dtype_cannot_hold_are_said(tmp_path_factory, values, dtype):
    d = tmp_path_factory.mktemp("n")
    lm = np.array(values, dtype).reshape(3, 2)
    with np.errstate(over="ignore"):
        lost = int(np.count_nonzero(np.isfinite(lm) & ~np.isfinite(lm.astype(np.float16))))  # independent count
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = import_npz(_npz(d / "a.npz", lm=lm), str(d / "s.zarr"), dtype="float16")
    said = [str(w.message) for w in caught if "beyond the range" in str(w.message)]
    assert said == ([f"{d / 'a.npz'} (run 'a'): loss_matrix holds {lost:,} finite losses beyond the range of float16 (largest 65504); they are stored "
                     f"as NaN (import with a wider --dtype, e.g. {np.dtype(dtype).name}, to keep them)"] if lost else [])  # fmt: skip
    got = r.losses().T
    with np.errstate(over="ignore"):
        want = lm.astype(np.float16)
    np.testing.assert_array_equal(got, np.where(np.isfinite(want), want, np.nan))


# -- per-checkpoint values: stored exactly or refused ------------------------------------------

BAD_ROWS = [
    dict(step=1.7), dict(step=2**63), dict(step="7"), dict(step=True), dict(step=np.uint64(2**64 - 1)),
    dict(step=5, tokens_seen=3.9), dict(step=5, tokens_seen=2**63), dict(step=5, ckpt_fingerprint=-1),
    dict(step=5, ckpt_fingerprint=2**64), dict(step=5, lr="x"),
]  # fmt: skip


@pytest.mark.echoes_numpy  # a row of numpy values is refused quoting them as given
@pytest.mark.parametrize("row", BAD_ROWS, ids=[repr(r)[:40] for r in BAD_ROWS])
def test_row_values_the_arrays_cannot_hold_are_refused_not_truncated(store, row):
    r = store.create_run("r")
    with r.writer() as w, pytest.raises(InputError):
        w.append(np.ones(8, np.float32), **row)
    assert r.n_committed == 0


def test_steps_beyond_2_53_that_would_share_an_axis_value_are_refused(store):
    """A step beyond 2**53 has a rounded axis value (the largest int64 step is a name a
    checkpoint may carry); the next step that rounds to the same one is refused, never stored
    with the row before's axis value."""
    r = store.create_run("r")
    with r.writer() as w:
        w.append(np.ones(8), step=2**53)
        with pytest.raises(StepOrderError, match="not after"):
            w.append(np.ones(8), step=2**53 + 1)
        w.append(np.ones(8), step=2**63 - 1)
    assert r.steps.tolist() == [2**53, 2**63 - 1] and r.axis_values.tolist() == [2.0**53, 2.0**63]


def test_whole_numbers_of_any_type_are_stored_exactly(store):
    r = store.create_run("r")
    with r.writer() as w:
        w.append(np.ones(8), step=5.0, tokens_seen=np.int32(7), ckpt_fingerprint=np.uint64(2**64 - 1), lr=np.float32(0.5))
        w.append(np.ones(8), step=2**62, axis_value=1e300)
    assert r.steps.tolist() == [5, 2**62] and r.coord("tokens_seen").tolist() == [7, -1]
    assert r.coord("ckpt_fingerprint").tolist() == [2**64 - 1, 0] and r.axis_values.tolist() == [5.0, 1e300]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.none() | st.floats(-1e18, 1e18)), min_size=1, max_size=6),
       together=st.booleans())  # fmt: skip
@example(rows=[(0, 1.0), (2**63 - 512, None)], together=False)  # exported as [1.0, 2.0**63]: refused on import
def test_a_run_holds_exactly_the_rows_whose_steps_and_axis_values_increase(store, rows, together):
    """Model: a row is accepted iff its step and its axis value (the step as a float64 when none
    is given: rounded beyond 2**53, so that a later step rounding to the same value is refused,
    `367ca4e`) come after the last accepted row's; accepted values read back exactly, and the
    run's export imports back to the same axis values, except where they are whole, not the
    steps, and reach 2**63: a T file's whole values are read as steps, so that file is refused."""
    name = f"p{np.random.default_rng().integers(1 << 40)}"
    r = store.create_run(name)
    accepted, last = [], None
    with r.writer() as w:
        for step, av in rows:
            value = float(step) if av is None else av
            ok = last is None or (step > last[0] and value > last[1])
            call = (lambda: w.append_rows(np.ones((1, 8)), [{"step": step, "axis_value": av}])) if together else (
                lambda: w.append(np.ones(8), step=step, axis_value=av))  # fmt: skip
            if ok:
                call()
                accepted.append((step, value))
                last = (step, value)
            else:
                with pytest.raises((InputError, StepOrderError)):
                    call()
    assert r.steps.tolist() == [s for s, _ in accepted] and r.axis_values.tolist() == [v for _, v in accepted]
    values = [v for _, v in accepted]
    as_steps = all(v >= 0 and v == int(v) for v in values) and any(float(s) != v for s, v in accepted)
    if accepted and as_steps and max(values) >= 2**63:  # whole values not the steps: import reads them as steps
        out = export_npz(r, f"{store.url}/../{name}.npz")
        with pytest.raises(InputError, match="a step on T must be below 2\\^63"):  # as docs/store.md says
            import_npz(out, store, run=name + "b")
    elif accepted:
        out = export_npz(r, f"{store.url}/../{name}.npz")
        back = import_npz(out, store, run=name + "b")
        assert back.axis_values.tolist() == values
        store.delete_run(name + "b")
    store.delete_run(name)


def test_a_resumed_writer_refuses_an_axis_value_before_the_committed_one(store):
    r = store.create_run("r", axis="D")
    with r.writer() as w:
        w.append(np.ones(8), step=0, axis_value=100.0)
    with r.writer(resume=True) as w, pytest.raises(StepOrderError, match="axis value 50.0 of step 1 is not after 100.0"):
        w.append(np.ones(8), step=1, axis_value=50.0)
    assert r.n_committed == 1


# -- importing into an existing store ---------------------------------------------------------

def test_an_import_into_a_store_refuses_other_token_layouts_and_says_what_it_drops(tmp_path):
    base = _npz(tmp_path / "a.npz", sample_id=np.zeros(4, int), token_pos=np.arange(1, 5))
    import_npz(base, str(tmp_path / "s.zarr"))
    rich = _npz(tmp_path / "b.npz", weight=np.arange(4.0), probe_tokens=np.array([[0, 5, 6, 7, 8]]),
                probe_tokenizer=np.array(['{"kind": "byte", "vocab_size": 257}']))  # fmt: skip
    with pytest.warns(UserWarning, match=r"has no weight, probe_tokens, probe_tokenizer; the file's are not kept"):
        import_npz(rich, str(tmp_path / "s.zarr"))
    other = _npz(tmp_path / "c.npz", probe_tokens=np.array([[0, 5], [0, 6], [0, 7], [0, 8]]))  # 4 sequences of 1 token
    with pytest.raises(ProbeMismatchError, match="'sample_id' differs"):
        import_npz(other, str(tmp_path / "s.zarr"))
    # the same file again (another run name) is taken without a word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import_npz(base, str(tmp_path / "s.zarr"), run="again")
    assert tokdyn.open_store(str(tmp_path / "s.zarr"), mode="r").runs == ["a", "again", "b"]


def test_a_tokenizer_other_than_the_stores_is_refused(tmp_path, capsys):
    spec = '{"kind": "byte", "vocab_size": 257}'
    import_npz(_npz(tmp_path / "a.npz", probe_tokenizer=np.array([spec])), str(tmp_path / "s.zarr"))
    f = _npz(tmp_path / "b.npz", probe_tokenizer=np.array(['{"kind": "hf", "vocab_size": 50257}']))
    code = main(["import-npz", f, str(tmp_path / "s.zarr")])
    assert "probe_tokenizer differs" in _one_error_line(capsys, code)


# -- reading any slice --------------------------------------------------------------------------

def _slices(n):
    return st.builds(slice, st.none() | st.integers(-n - 2, n + 2), st.none() | st.integers(-n - 2, n + 2),
                     st.none() | st.integers(-3, 3).filter(bool))  # fmt: skip


@pytest.fixture(scope="module")
def six_rows(tmp_path_factory):
    d = tmp_path_factory.mktemp("six")
    lm = np.arange(6 * 20, dtype=np.float32).reshape(20, 6)
    st_ = tokdyn.open_store(str(d / "s.zarr"), tokdyn.ProbeSet.from_tokens(np.zeros((4, 6), int)), mode="a")
    r = st_.create_run("r", token_chunk=5)
    with r.writer() as w:
        for j in range(6):
            w.append(lm[:, j], step=j + 1)
    return r, lm.T


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_losses_with_any_row_and_token_slice_is_numpys(six_rows, data):
    r, full = six_rows
    rows, tokens = data.draw(st.none() | _slices(6)), data.draw(st.none() | _slices(20))
    want = full[rows if rows is not None else slice(None)][:, tokens if tokens is not None else slice(None)]
    np.testing.assert_array_equal(r.losses(rows=rows, tokens=tokens), want)


# -- two processes creating one run -------------------------------------------------------------

def test_a_run_created_by_another_process_meanwhile_is_one_clear_error(store, monkeypatch):
    """The race: the other process's run appears after this one checked the name was free."""
    other = store.create_run("r")
    with other.writer() as w:
        w.append(np.full(8, 3.0), step=1)
    monkeypatch.setattr(type(store), "runs", property(lambda self: []))  # the check before saw no run "r"
    with pytest.raises(RunBusyError, match="created by another process at the same time"):
        store.create_run("r")
    monkeypatch.undo()
    r = tokdyn.open_store(store.url, mode="r").run("r")
    assert r.n_committed == 1 and r.losses().tolist() == [[3.0] * 8]


# -- the recorder checks a row's values as its writer does, in the caller's thread ------------------


@pytest.mark.parametrize("step, extra", [(1.7, {}), ("7", {}), (True, {}), (2, {"tokens_seen": 12.5}),
                                         (2, {"tokens_seen": 2**63}), (2, {"lr": "high"})])
def test_the_recorder_refuses_at_the_call_what_its_writer_cannot_hold(tiny_model, probe, store_path, step, extra):
    from tokdyn.record import TokenLossRecorder

    with TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=[0, 2, 3]) as rec:
        rec.record(0)
        with pytest.raises(InputError):
            rec.record(step, **extra)  # step 1.7 was stored as step 1; a tokens_seen of 12.5 stopped the writer
        rec.record(3, tokens_seen=3.0 * 64, lr=np.float32(1e-3))  # whole floats and numpy numbers are fine
    run = tokdyn.open_store(store_path).run("r")
    assert run.coord("step").tolist() == [0, 3] and run.coord("tokens_seen").tolist() == [-1, 192]


def test_a_store_path_under_home_is_the_users_home(tmp_path, monkeypatch, probe):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    st = tokdyn.open_store("~/runs.zarr", probe, mode="w")
    st.create_run("r", capacity=1).writer().append(np.zeros(probe.n_tokens, np.float32), step=0)
    assert (tmp_path / "home" / "runs.zarr" / "zarr.json").exists() and not (tmp_path / "~").exists()
    assert tokdyn.open_store("~/runs.zarr").run("r").n_committed == 1


def test_info_names_a_d_run_by_its_budgets_and_a_t_run_by_its_steps(tmp_path, probe, capsys):
    path = str(tmp_path / "s.zarr")
    st = tokdyn.open_store(path, probe, mode="w")
    w = st.create_run("d", axis="D", capacity=2).writer()
    for k, budget in enumerate((1e6, 3.2e7)):
        w.append(np.ones(probe.n_tokens, np.float32), step=k, axis_value=budget)
    w = st.create_run("t", capacity=2).writer()
    for step in (0, 12345):
        w.append(np.ones(probe.n_tokens, np.float32), step=step)
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    assert "data budgets 1e+06..3.2e+07" in out and "steps 0..12,345" in out


@pytest.mark.parametrize("legacy", [" ", "tab\there", "x.partial"])
def test_a_run_an_older_version_named_so_is_still_read_and_deleted(tmp_path, probe, monkeypatch, legacy):
    """The stricter rule is for new runs: a store an older version wrote keeps working."""
    import tokdyn.store.store as store_module

    path = str(tmp_path / "s.zarr")
    st = tokdyn.open_store(path, probe, mode="w")
    with monkeypatch.context() as m:  # as the version before the rule made it
        m.setattr(store_module, "check_run_name", lambda name, new=False: None)
        st.create_run(legacy, capacity=1).writer().append(np.zeros(probe.n_tokens, np.float32), step=0)
    st.create_run("good", capacity=1).writer().append(np.zeros(probe.n_tokens, np.float32), step=0)
    st = tokdyn.open_store(path, mode="r+")
    assert st.run(legacy).n_committed == 1  # by name (a .partial one is left out of the listing)
    assert main(["info", path]) == 0
    st.delete_run(legacy)
    assert legacy not in st.runs and st.run("good").n_committed == 1
    with pytest.raises(InputError):
        st.create_run(legacy)  # but no new run gets such a name


def test_a_file_url_with_fsspec_options_opens_as_its_path_with_a_warning(tmp_path, probe):
    tokdyn.open_store(str(tmp_path / "a.zarr"), probe, mode="w")
    with pytest.warns(UserWarning, match="takes none"):
        st = tokdyn.open_store(f"file://{tmp_path}/a.zarr", mode="r", storage_options={"auto_mkdir": True})
    assert st.url == f"{tmp_path}/a.zarr" and st.probe.n_tokens == probe.n_tokens and not st.storage_options


def test_a_file_with_token_ids_imports_into_a_store_made_from_one_without(tmp_path):
    rng = np.random.default_rng(0)
    lm = rng.random((10, 3)).astype(np.float32)
    common = dict(axis_values=np.array([10, 20, 30]), loss_matrix=lm, axis_name=np.array(["T"]))
    np.savez(tmp_path / "plain.npz", **common)
    np.savez(tmp_path / "tok.npz", **common, probe_tokens=rng.integers(0, 257, size=(2, 6)))
    store = str(tmp_path / "s.zarr")
    import_npz(str(tmp_path / "plain.npz"), store)
    with pytest.warns(UserWarning, match="probe_tokens"):  # kept out, and said
        run = import_npz(str(tmp_path / "tok.npz"), store, run="tok")
    assert np.array_equal(run.losses(), lm.T)


def test_info_prints_a_legacy_name_that_would_split_its_line_escaped(tmp_path, probe, monkeypatch, capsys):
    import tokdyn.store.store as store_module

    path = str(tmp_path / "s.zarr")
    st = tokdyn.open_store(path, probe, mode="w")
    with monkeypatch.context() as m:  # a name an older version accepted
        m.setattr(store_module, "check_run_name", lambda name, new=False: None)
        st.create_run("a\nrun fake axis T  9 x 9", capacity=1).writer().append(np.zeros(probe.n_tokens, np.float32), step=0)
    assert main(["info", path]) == 0
    runs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("run ")]
    assert len(runs) == 1 and "'a\\nrun fake" in runs[0]


def test_a_step_near_the_int64_limit_exports_and_imports_back(store, tmp_path):
    # step 2**63 - 512 (axis value 2**63 as a float64) was written, exported as the float 2**63,
    # and its own export was refused on import ("a step on T must be below 2^63"); found by the
    # store property above once its model followed the writer
    r = store.create_run("big")
    with r.writer() as w:
        w.append(np.ones(8), step=2**63 - 512)
    out = export_npz(r, str(tmp_path / "big.npz"))
    back = import_npz(out, store, run="bigb")
    assert back.steps.tolist() == [2**63 - 512] and back.axis_values.tolist() == r.axis_values.tolist()
