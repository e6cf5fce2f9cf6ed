"""The probe's reserved per-token arrays (``sample_id``, ``token_pos``, ``token_id``) from outside
data: a ``losses.npz``, a ``ProbeSet`` built in code, a store whose probe was written by an older
tokdyn. Either they are whole numbers >= 0 (token ids below the vocabulary size when known) and
every analysis works on them, or they are refused with one InputError naming the array; never
an internal error later (the report crashed on strings, ``spectrum --by`` on negative positions).

Also: an import that fails into an existing empty folder leaves the folder in place."""

from __future__ import annotations

import json
import types
import warnings

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tokdyn
from tokdyn.cli import main
from tokdyn.errors import InputError
from tokdyn.interchange import export_npz, import_npz, read_npz

RESERVED = ("sample_id", "token_pos", "token_id")
DTYPES = ["i1", "i2", "<i4", ">i4", "i8", "u1", "u2", "u4", "u8", "f2", "<f4", ">f8", "?", "U3"]


def expected_ok(name: str, v: np.ndarray, vocab: int | None) -> bool:
    """The rule, written independently of tokdyn's code."""
    if v.dtype.kind not in "iuf":
        return False
    if v.dtype.kind == "f":
        if not np.all(np.isfinite(v)) or np.any(v != np.floor(v)):
            return False
        lo, hi = float(v.min()), float(v.max())
    else:
        lo, hi = int(v.min()), int(v.max())
    limit = (vocab or 2**31) if name == "token_id" else 2**63
    return lo >= 0 and hi < limit


@st.composite
def reserved_arrays(draw, n: int):
    """Some of the reserved arrays, each of any dtype, with values from anywhere in it or small
    non-negative whole numbers (valid), and maybe a tokenizer vocabulary size."""
    arrays = {}
    for name in RESERVED:
        if not draw(st.booleans()):
            continue
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        if dtype.kind in "iuf" and draw(st.booleans()):  # small whole numbers, valid unless the vocabulary is smaller
            arrays[name] = np.asarray(draw(st.lists(st.integers(0, 120), min_size=n, max_size=n)), dtype=dtype)
        else:
            arrays[name] = draw(hnp.arrays(dtype, n))
    vocab = draw(st.sampled_from([None, 2, 60, 50_000]))
    return arrays, vocab


def _losses(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Axis values and a [n, k] loss matrix of sigmoid drops (something the fit can fit)."""
    rng = np.random.default_rng(0)
    steps = np.unique(np.round(np.geomspace(10, 1e5, k))).astype(float)
    x = np.log10(steps)
    mu = rng.uniform(2, 4, n)
    lm = 1 + 3 / (1 + np.exp((x[None, :] - mu[:, None]) / 0.1)) + 0.05 * rng.standard_normal((n, x.size))
    return steps, lm.astype(np.float32)


def _write(path, arrays: dict, vocab: int | None, n: int, k: int) -> None:
    steps, lm = _losses(n, k)
    extra = {} if vocab is None else {"probe_tokenizer": np.array([json.dumps({"kind": "hf", "vocab_size": vocab})])}
    np.savez(path, axis_values=steps, loss_matrix=lm, axis_name=np.array(["T"]), **arrays, **extra)


def _cli(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


def _check_refusal(err: str, arrays: dict, vocab: int | None) -> None:
    assert err.count("\n") == 1, err  # one line
    bad = [name for name, v in arrays.items() if not expected_ok(name, v, vocab)]
    assert any(f"'{name}'" in err for name in bad), (err, bad)


# -- import-npz: a clean import or one InputError, and the rule exactly ----------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(drawn=reserved_arrays(12))
def test_import_npz_accepts_exactly_whole_numbers_at_least_0(tmp_path_factory, capsys, drawn):
    arrays, vocab = drawn
    tmp = tmp_path_factory.mktemp("imp")
    _write(tmp / "in.npz", arrays, vocab, 12, 3)
    ok = all(expected_ok(name, v, vocab) for name, v in arrays.items())
    code, err = _cli(["import-npz", tmp / "in.npz", tmp / "s.zarr"], capsys)
    if not ok:
        assert code == 1
        _check_refusal(err, arrays, vocab)
        assert not (tmp / "s.zarr").exists()
        with pytest.raises(InputError):  # the library says the same
            read_npz(tmp / "in.npz")
        return
    assert code == 0, err
    probe = tokdyn.open_store(tmp / "s.zarr", mode="r").probe
    for name, v in arrays.items():  # kept as the file has them (native byte order)
        got = probe.token_arrays[name]
        assert got.dtype == v.dtype.newbyteorder("="), name
        np.testing.assert_array_equal(got, v)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=reserved_arrays(10))
def test_probeset_accepts_exactly_whole_numbers_at_least_0(drawn):
    arrays, vocab = drawn
    base = {"sample_id": np.arange(10), "token_pos": np.ones(10, np.int32)}
    tokenizer = {} if vocab is None else {"kind": "hf", "vocab_size": vocab}
    ok = all(expected_ok(name, v, vocab) for name, v in arrays.items())
    try:
        probe = tokdyn.ProbeSet(None, {**base, **arrays}, tokenizer=tokenizer)
    except InputError as exc:
        assert not ok, exc
        assert any(f"'{name}'" in str(exc) for name, v in arrays.items() if not expected_ok(name, v, vocab)), exc
        return
    assert ok, arrays
    assert probe.n_tokens == 10


# -- ... and what is accepted, the analyses read ------------------------------------------


N, K = 24, 12


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(drawn=reserved_arrays(N))
# the reviewer's cases: the report's "internal error", and every `spectrum --by` refused
@example(drawn=({"sample_id": np.array(["x"] * N)}, None))
@example(drawn=({"token_id": np.array(["a", "b"] * (N // 2))}, None))
@example(drawn=({"token_pos": np.array([str(i) for i in range(N)])}, None))
@example(drawn=({"token_pos": -np.arange(N)}, None))
# accepted, of odd dtypes: unsigned, whole floats, big-endian, a large (2**62) position
@example(drawn=({"sample_id": np.arange(N, dtype="u8") * 2**40, "token_pos": np.arange(N, dtype="f4"),
                 "token_id": np.arange(N, dtype=">i2") % 5}, 50_000))  # fmt: skip
@example(drawn=({"token_pos": np.full(N, 2**62, dtype="u8"), "token_id": (np.arange(N) % 2).astype("f8")}, 2))
def test_what_import_npz_accepts_every_analysis_reads(tmp_path_factory, capsys, drawn):
    arrays, vocab = drawn
    tmp = tmp_path_factory.mktemp("pipe")
    _write(tmp / "in.npz", arrays, vocab, N, K)
    store = tmp / "s.zarr"
    code, err = _cli(["import-npz", tmp / "in.npz", store], capsys)
    if code:
        _check_refusal(err, arrays, vocab)
        assert not store.exists()
        return
    assert _cli(["fit", store, "--no-progress", "--scheduler", "sync", "--no-two-step"], capsys) == (0, "")
    for by in ("class", "position", *(("frequency",) if "token_id" in arrays else ())):
        code, err = _cli(["spectrum", store, "--by", by], capsys)
        assert code == 0, (by, err)
    code, err = _cli(["report", store, "--out", tmp / "r.html"], capsys)
    assert code == 0 and (tmp / "r.html").is_file(), err


# -- a store whose probe arrays are not numbers (written by an older tokdyn) --------------


def _rewrite_probe_array(path, name: str, values: np.ndarray) -> None:
    """Replace a probe array and the recorded fingerprints to match, as an older tokdyn's
    import-npz of such a file wrote the store (the content hashes consistently)."""
    g = zarr.open_group(str(path), mode="r+")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")
        g["probe"].create_array(name, shape=values.shape, dtype=values.dtype, dimension_names=("token",), overwrite=True)[...] = values
        a = dict(g["probe"].attrs)
        arrays = {k: g["probe"][k][...] for k in a["token_arrays"]}
    fake = types.SimpleNamespace(tokens=None, token_arrays=arrays, domains=tuple(a["domains"]), documents=tuple(a["documents"]),
                                 tokenizer=a["tokenizer"])  # fmt: skip
    fp = tokdyn.ProbeSet.fingerprint.func(fake)
    g["probe"].attrs["fingerprint"] = fp
    g.attrs["tokdyn"] = {**g.attrs["tokdyn"], "probe_fingerprint": fp}


@pytest.mark.parametrize("name, values", [("sample_id", np.array(["x"] * N)), ("token_pos", -np.arange(N)),
                                          ("token_id", np.arange(N) + 0.5)])  # fmt: skip
def test_a_store_whose_probe_arrays_are_not_whole_numbers_is_one_error(tmp_path, capsys, name, values):
    _write(tmp_path / "in.npz", {"token_id": np.arange(N) % 3}, None, N, K)
    store = tmp_path / "s.zarr"
    assert main(["import-npz", str(tmp_path / "in.npz"), str(store)]) == 0
    assert main(["fit", str(store), "--no-progress", "--scheduler", "sync", "--no-two-step"]) == 0
    _rewrite_probe_array(store, name, values)
    capsys.readouterr()
    for argv in (["info", store], ["spectrum", store, "--by", "class"], ["report", store, "--out", tmp_path / "r.html"],
                 ["export-npz", store, tmp_path / "o.npz", "--run", "in"]):  # fmt: skip
        code, err = _cli(argv, capsys)
        assert code == 1 and err.count("\n") == 1 and f"'{name}'" in err, (argv, err)


# -- rules beside the arrays ---------------------------------------------------------------


@pytest.mark.parametrize("vocab", ["abc", 1, True, 2.5, -3])
def test_a_tokenizer_vocabulary_size_that_is_not_an_integer_is_refused(tmp_path, capsys, vocab):
    """The fit reads it (age of acquisition): "abc" was an internal error there, 2.5 a silent 2."""
    steps, lm = _losses(N, K)
    np.savez(tmp_path / "in.npz", axis_values=steps, loss_matrix=lm, axis_name=np.array(["T"]),
             probe_tokenizer=np.array([json.dumps({"kind": "hf", "vocab_size": vocab})]))  # fmt: skip
    code, err = _cli(["import-npz", tmp_path / "in.npz", tmp_path / "s.zarr"], capsys)
    assert code == 1 and "vocab_size must be an integer >= 2" in err and err.count("\n") == 1
    assert not (tmp_path / "s.zarr").exists()


def test_token_ids_beyond_the_vocabulary_are_refused():
    with pytest.raises(InputError, match=r"probe array 'token_id' .* below the vocabulary size 10; got values up to 12"):
        tokdyn.ProbeSet(None, {"sample_id": np.zeros(3), "token_pos": np.ones(3), "token_id": np.array([1, 12, 3])},
                        tokenizer={"kind": "hf", "vocab_size": 10})  # fmt: skip
    with pytest.raises(InputError, match=r"probe tokens must be ids in \[0, 10\)"):
        tokdyn.ProbeSet.from_tokens(np.array([[11, 1, 2]]), tokenizer={"kind": "hf", "vocab_size": 10})
    with pytest.raises(InputError, match=r"probe tokens must be ids in \[0, 2147483648\)"):
        tokdyn.ProbeSet.from_tokens(np.array([[2**31, 1, 2]]))  # would wrap in int32


def test_an_exported_store_still_round_trips(tmp_path):
    probe = tokdyn.ProbeSet.from_tokens(np.arange(15).reshape(3, 5) % 7, tokenizer={"kind": "byte", "vocab_size": 257, "eot_id": 256})
    store = tokdyn.open_store(tmp_path / "a.zarr", probe, mode="a")
    run = store.create_run("r", capacity=2)
    w = run.writer()
    for j in range(2):
        w.append(np.ones(12, np.float32), step=j + 1)
    w.release()
    export_npz(run, tmp_path / "a.npz")
    assert import_npz(tmp_path / "a.npz", tmp_path / "b.zarr").store.probe.fingerprint == probe.fingerprint


# -- a failed import into an existing empty folder leaves the folder ------------------------


def _fail(*args, **kwargs):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("where", ["create_run", "append", "write_probe"])
def test_a_failed_import_into_an_empty_folder_leaves_the_folder(tmp_path, monkeypatch, where):
    _write(tmp_path / "in.npz", {}, None, N, K)
    folder = tmp_path / "empty"
    folder.mkdir(mode=0o750)
    mode = folder.stat().st_mode
    if where == "create_run":
        monkeypatch.setattr(tokdyn.TrajectoryStore, "create_run", _fail)
    elif where == "append":
        monkeypatch.setattr(tokdyn.RunWriter, "append", _fail)
    else:  # the store's own creation fails, after it made the group
        monkeypatch.setattr(tokdyn.store.store, "write_probe", _fail)
    with pytest.raises(OSError, match="No space left"):
        import_npz(tmp_path / "in.npz", folder)
    assert folder.is_dir() and list(folder.iterdir()) == [] and folder.stat().st_mode == mode
    monkeypatch.undo()
    assert import_npz(tmp_path / "in.npz", folder).n_committed == K  # and it is usable


def test_a_refused_import_into_an_empty_folder_leaves_it_by_the_command_line(tmp_path, capsys):
    _write(tmp_path / "in.npz", {}, None, N, K)
    folder = tmp_path / "empty"
    folder.mkdir()
    code, err = _cli(["import-npz", tmp_path / "in.npz", folder, "--run", "a/b"], capsys)
    assert code == 1 and "run name" in err and err.count("\n") == 1
    assert folder.is_dir() and list(folder.iterdir()) == []
    code, err = _cli(["import-npz", tmp_path / "in.npz", tmp_path / "new.zarr", "--run", "a/b"], capsys)
    assert code == 1 and not (tmp_path / "new.zarr").exists()


def test_a_failed_import_into_a_new_path_leaves_nothing(tmp_path, monkeypatch):
    _write(tmp_path / "in.npz", {}, None, N, K)
    monkeypatch.setattr(tokdyn.RunWriter, "append", _fail)
    with pytest.raises(OSError):
        import_npz(tmp_path / "in.npz", tmp_path / "new.zarr")
    assert not (tmp_path / "new.zarr").exists()
