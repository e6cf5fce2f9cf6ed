"""A catalogue of hostile and malformed inputs, each named, across the CLI and the Python API.

Every case damages a copy of a good store, or writes a bad file, and runs one command or call.
It must fail with one clear message (CLI: exit 1 and one line on stderr, no traceback; API: a
tokdyn error naming the problem) and leave every file that was already stored as it was
(compared byte for byte). ``CLI_CASES`` and ``API_CASES`` are counted in docs/reliability.md.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

import tokdyn
from reliability_fixtures import cli_error_line, raw, run_cli, snapshot
from test_offline import _Touch
from test_store import make_probe, row_values
from tokdyn.errors import InputError, StoreError, TokdynError, UnsafeFileError

STEPS = [0, 1, 2, 4, 8, 16]
CONTEXT = 8


@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> Path:
    """A store with a probe of 6 sequences x 8 tokens and run ``r`` of 6 committed rows in
    chunks of 16 tokens; the cases damage copies of it."""
    path = tmp_path_factory.mktemp("good") / "s.zarr"
    probe = make_probe(n_seq=6, context=CONTEXT)
    st = tokdyn.open_store(path, probe, mode="a")
    with st.create_run("r", capacity=len(STEPS), token_chunk=2 * CONTEXT).writer() as w:
        for s in STEPS:
            w.append(row_values(s, probe.n_tokens) * (1 + s / 10), step=s)
    st.create_run("empty")
    return path


def _npz(path: Path, **change) -> Path:
    arrays = {"axis_values": np.array([1.0, 2.0, 4.0]), "loss_matrix": np.ones((48, 3), np.float32) * [3, 2, 1],
              "axis_name": np.array(["T"])}  # fmt: skip
    arrays.update(change)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def _chunk(store: Path, row: int, block: int = 0) -> Path:
    return store / "runs" / "r" / "loss" / "c" / str(row) / str(block)


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _replace_array(store: Path, name: str, values: np.ndarray | None = None, **kwargs) -> None:
    """Put another array where ``name`` was (a foreign or hand-edited store)."""
    g = zarr.open_group(str(store), mode="r+")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = g.create_array(name, overwrite=True, **kwargs)
        if values is not None:
            a[...] = values


def _set_array(store: Path, name: str, values) -> None:
    zarr.open_array(str(store / name), mode="r+")[...] = values


def _set_attrs(store: Path, group: str, key: str, value) -> None:
    g = zarr.open_group(str(store / group) if group else str(store), mode="r+")
    g.attrs[key] = value


def _pickle_exploit(folder: Path, marker: Path) -> None:
    from offline_fixtures import make_model, write_spec

    folder.mkdir()
    write_spec(folder)
    sd = dict(make_model(1).state_dict())
    sd["extra"] = _Touch(marker)  # unpickling it would create ``marker``
    torch.save(sd, folder / "step_10.pt")


# Each CLI case: (setup(tmp, store) -> argv, message regex). ``store`` is a fresh copy of the
# good store; ``tmp`` a scratch folder. The files present before the command must not change.
CLI_CASES: dict[str, tuple[Callable[[Path, Path], list[str]], str]] = {
    "store path does not exist": (lambda t, s: ["info", str(t / "nope.zarr")], r"no tokdyn store"),
    "store path is a plain file": (lambda t, s: ["info", str(_write(t / "f.txt", b"hello"))], r"no tokdyn store|not a tokdyn store"),
    "zarr group that is not a tokdyn store": (lambda t, s: ["info", str(_foreign(t))], r"not a tokdyn store"),
    "root metadata missing": (lambda t, s: (s.joinpath("zarr.json").unlink(), ["info", str(s)])[1], r"no tokdyn store"),
    "root metadata truncated": (lambda t, s: (_truncate(s / "zarr.json"), ["info", str(s)])[1], r"metadata is unreadable"),
    "root metadata is binary garbage": (lambda t, s: (_write(s / "zarr.json", bytes(range(256))), ["info", str(s)])[1], r"metadata is unreadable"),
    "unknown store schema version": (lambda t, s: (_set_attrs(s, "", "tokdyn", {**_root(s), "schema_version": 99}), ["info", str(s)])[1], r"schema version 99"),
    "run metadata truncated": (lambda t, s: (_truncate(s / "runs/r/zarr.json"), ["fit", str(s), "--run", "r"])[1], r"run 'r'.*(unreadable|damaged)"),
    "unknown run schema version": (lambda t, s: (_set_attrs(s, "runs/r", "tokdyn_run", {**_run(s), "schema_version": 7}), ["fit", str(s), "--run", "r"])[1], r"schema version 7"),
    "commit record truncated": (lambda t, s: (_truncate(s / "runs/r/commits/w0/zarr.json"), ["export-npz", str(s), str(t / "o.npz"), "--run", "r"])[1], r"commit record .* unreadable"),
    "commit record counts more rows than stored": (lambda t, s: (_set_attrs(s, "runs/r/commits/w0", "rows", 60), ["export-npz", str(s), str(t / "o.npz"), "--run", "r"])[1], r"count 60 rows.*holds 6"),
    "loss chunk truncated": (lambda t, s: (_truncate(_chunk(s, 2)), ["export-npz", str(s), str(t / "o.npz"), "--run", "r"])[1], r"cannot decode loss.*damaged"),
    "loss chunk overwritten with garbage": (lambda t, s: (_write(_chunk(s, 3, 1), b"\x00garbage" * 20), ["fit", str(s), "--run", "r", "--no-progress", "--min-points", "5"])[1], r"cannot decode loss.*damaged"),
    "loss chunk missing": (lambda t, s: (_chunk(s, 4, 2).unlink(), ["export-npz", str(s), str(t / "o.npz"), "--run", "r"])[1], r"row 4: 16 losses read as missing.*chunk files"),
    "loss array of object dtype": (lambda t, s: (_replace_array(s, "runs/r/loss", shape=(6, 48), dtype=zarr.dtype.VariableLengthBytes()), ["export-npz", str(s), str(t / "o.npz"), "--run", "r"])[1], r"loss must be a 2-D array of float32/float16/float64, found object"),
    "loss array of strings": (lambda t, s: (_replace_array(s, "runs/r/loss", shape=(6, 48), dtype=str), ["fit", str(s), "--run", "r"])[1], r"loss must be a 2-D array"),
    "loss array of the wrong shape": (lambda t, s: (_replace_array(s, "runs/r/loss", np.ones((6, 40), "f4"), shape=(6, 40), dtype="float32"), ["fit", str(s), "--run", "r"])[1], r"loss has 40 tokens.*probe has 48"),
    "step array of the wrong dtype": (lambda t, s: (_replace_array(s, "runs/r/step", np.arange(6.0), shape=(6,), dtype="float64"), ["export-npz", str(s), str(t / "o.npz"), "--run", "r"])[1], r"step must be a 1-D int64 array, found float64"),
    "unsorted axis values in a stored run": (lambda t, s: (_set_array(s, "runs/r/axis_value", [0, 2, 1, 4, 8, 16]), ["fit", str(s), "--run", "r"])[1], r"run 'r': axis values: expected strictly increasing"),
    "duplicate axis values in a stored run": (lambda t, s: (_set_array(s, "runs/r/axis_value", [0, 1, 2, 2, 8, 16]), ["fit", str(s), "--run", "r"])[1], r"strictly increasing"),
    "NaN axis value in a committed row": (lambda t, s: (_set_array(s, "runs/r/axis_value", [0, 1, np.nan, 4, 8, 16]), ["fit", str(s), "--run", "r", "--no-progress"])[1], r"non-finite axis values at rows \[2\]"),
    "inf axis value in a committed row": (lambda t, s: (_set_array(s, "runs/r/axis_value", [0, 1, 2, 4, np.inf, 16]), ["fit", str(s), "--run", "r", "--no-progress"])[1], r"non-finite axis values at rows \[4\]"),
    "probe array modified": (lambda t, s: (_set_array(s, "probe/token_id", np.zeros(48, "i4")), ["export-npz", str(s), str(t / "o.npz"), "--run", "r"])[1], r"probe arrays were modified or damaged"),
    "probe array of object dtype": (lambda t, s: (_replace_array(s, "probe/domain", shape=(48,), dtype=zarr.dtype.VariableLengthBytes()), ["export-npz", str(s), str(t / "o.npz"), "--run", "r"])[1], r"probe array 'domain' has dtype object"),
    "fit of a run that does not exist": (lambda t, s: ["fit", str(s), "--run", "nope"], r"no run 'nope'.*runs: empty, r"),
    "fit of a run without rows": (lambda t, s: ["fit", str(s), "--run", "empty"], r"no committed rows"),
    "fit of an empty store": (lambda t, s: ["fit", str(_empty_store(t)), "--run", "r"], r"runs: none"),
    "fit with zero workers": (lambda t, s: ["fit", str(s), "--run", "r", "--workers", "0"], r"--workers must be an integer >= 1"),
    "fit with zero batch rows": (lambda t, s: ["fit", str(s), "--run", "r", "--batch-rows", "0"], r"--batch-rows must be an integer >= 1"),
    "export of a run without rows": (lambda t, s: ["export-npz", str(s), str(t / "o.npz"), "--run", "empty"], r"no committed rows to export"),
    "export into a folder that does not exist": (lambda t, s: ["export-npz", str(s), str(t / "no" / "o.npz"), "--run", "r"], r"output folder does not exist"),
    "export into a path that cannot be written": (lambda t, s: ["export-npz", str(s), str(_write(t / "f", b"x") / "o.npz"), "--run", "r"], r"Not a directory|does not exist"),
    "export to a name without .npz": (lambda t, s: ["export-npz", str(s), str(t / "o.csv"), "--run", "r"], r"ends in .npz"),
    "import of a truncated npz": (lambda t, s: ["import-npz", str(_truncated_npz(t)), str(s)], r"not a readable npz"),
    "import of a file that is not an npz": (lambda t, s: ["import-npz", str(_write(t / "x.npz", b"PK no zip")), str(s)], r"not a readable npz"),
    "import of an npz with object arrays": (lambda t, s: ["import-npz", str(_evil_npz(t)), str(s)], r"object arrays that need pickle"),
    "import with NaN axis values": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", axis_values=np.array([1.0, np.nan, 4.0]))), str(s)], r"finite and strictly increasing"),
    "import with inf axis values": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", axis_values=np.array([1.0, 2.0, np.inf]))), str(s)], r"finite and strictly increasing"),
    "import with unsorted axis values": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", axis_values=np.array([1.0, 4.0, 2.0]))), str(s)], r"strictly increasing"),
    "import with duplicate axis values": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", axis_values=np.array([1.0, 2.0, 2.0]))), str(s)], r"strictly increasing"),
    "import with an integer loss matrix": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", loss_matrix=np.ones((48, 3), np.int64))), str(s)], r"loss_matrix must be a float array"),
    "import with a 1-D loss matrix": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", loss_matrix=np.ones(48, np.float32))), str(s)], r"loss_matrix must be a float array \[N, K\]"),
    "import with axis values of the wrong length": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", axis_values=np.array([1.0, 2.0]))), str(s)], r"to match loss_matrix"),
    "import without loss_matrix": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", loss_matrix=None)), str(s)], r"lacks loss_matrix"),
    "import with an unknown axis name": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", axis_name=np.array(["Q"]))), str(s)], r"axis_name"),
    "import into a store of another probe": (lambda t, s: ["import-npz", str(_npz(t / "n.npz", loss_matrix=np.ones((30, 3), np.float32))), str(s)], r"npz has 30 tokens; the store's probe has 48"),
    "import over an existing run": (lambda t, s: ["import-npz", str(_npz(t / "r.npz")), str(s), "--run", "r"], r"run 'r' already exists"),
    "import into a path that cannot be written": (lambda t, s: ["import-npz", str(_npz(t / "n.npz")), str(_write(t / "f", b"x") / "s.zarr")], r"f is a file, not a folder"),
    "record-offline from a folder that does not exist": (lambda t, s: ["record-offline", "--checkpoints", str(t / "nope"), "--out", str(s), "--run", "o", "--no-progress"], r"nope"),
    "record-offline of a pickle that would run code": (lambda t, s: (_pickle_exploit(t / "ck", t / "pwned"), ["record-offline", "--checkpoints", str(t / "ck"), "--out", str(s), "--run", "o", "--no-progress", "--workers", "1"])[1], r"step_10\.pt.*weights_only=True"),
    "record-offline of a truncated checkpoint": (lambda t, s: (_truncated_checkpoint(t / "ck"), ["record-offline", "--checkpoints", str(t / "ck"), "--out", str(s), "--run", "o", "--no-progress", "--workers", "1"])[1], r"step_10\.pt"),
    "record-offline with a truncated manifest": (lambda t, s: (_truncated_manifest(t / "ck"), ["record-offline", "--checkpoints", str(t / "ck"), "--out", str(s), "--run", "o", "--no-progress"])[1], r"manifest"),
}


def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _foreign(t: Path) -> Path:
    zarr.open_group(str(t / "foreign.zarr"), mode="w").attrs["x"] = 1
    return t / "foreign.zarr"


def _root(s: Path) -> dict:
    return dict(zarr.open_group(str(s), mode="r").attrs["tokdyn"])


def _run(s: Path) -> dict:
    return dict(zarr.open_group(str(s / "runs/r"), mode="r").attrs["tokdyn_run"])


def _empty_store(t: Path) -> Path:
    tokdyn.open_store(t / "e.zarr", make_probe(n_seq=2, context=CONTEXT), mode="a")
    return t / "e.zarr"


def _truncated_npz(t: Path) -> Path:
    p = _npz(t / "t.npz")
    _truncate(p)
    return p


def _evil_npz(t: Path) -> Path:
    arr = np.empty(48, dtype=object)
    arr[0] = _Touch(t / "pwned")
    return _npz(t / "evil.npz", meta=arr)


def _truncated_checkpoint(folder: Path) -> None:
    from offline_fixtures import make_model, save_torch, write_spec

    folder.mkdir()
    write_spec(folder)
    save_torch(make_model(1), folder / "step_10.pt")
    _truncate(folder / "step_10.pt")


def _truncated_manifest(folder: Path) -> None:
    folder.mkdir()
    text = json.dumps({"checkpoints": [{"path": "step_10.pt", "step": 10}]})
    (folder / "manifest.json").write_text(text[: len(text) // 2])


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_cli_bad_input(name, good_store, tmp_path, capsys):
    setup, message = CLI_CASES[name]
    store = tmp_path / "s.zarr"
    shutil.copytree(good_store, store)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's unstable-dtype notes while damaging the store
        argv = setup(scratch, store)
    before = snapshot(tmp_path)
    code, err = run_cli(argv, capsys)
    assert code == 1, f"{name}: exit {code}, stderr {err!r}"
    line = cli_error_line(err)
    assert line.startswith(f"tokdyn {argv[0]}: error: ")
    assert re.search(message, line), f"{name}: {line!r} does not match {message!r}"
    after = snapshot(tmp_path)
    changed = [f for f, digest in before.items() if after.get(f) != digest]
    assert not changed, f"{name}: the failed command changed or removed {changed}"
    assert not (scratch / "pwned").exists()  # no pickle was ever run


# -- the Python API -----------------------------------------------------------------------


def _writer(tmp: Path):
    st = tokdyn.open_store(tmp / "w.zarr", make_probe(n_seq=2, context=CONTEXT), mode="a")
    return st.create_run("w").writer()


def _damaged_run(tmp: Path, **arrays) -> tokdyn.Run:
    """Run ``r`` of a store whose per-checkpoint arrays were overwritten by hand."""
    probe = make_probe(n_seq=2, context=CONTEXT)
    st = tokdyn.open_store(tmp / "d.zarr", probe, mode="a")
    with st.create_run("r").writer() as w:
        for s in STEPS:
            w.append(row_values(s, probe.n_tokens), step=s)
    for name, values in arrays.items():
        raw(st, f"runs/r/{name}")[: len(values)] = values
    return tokdyn.open_store(tmp / "d.zarr", mode="r").run("r")


def _fitter(**kw):
    from tokdyn.fit import SigmoidFitter

    return SigmoidFitter(**kw)


X = np.log10([1, 2, 4, 8, 16, 32, 64, 128.0])
Y = np.linspace(5, 1, 8)[None, :].repeat(3, 0)

# Each API case: (call(tmp), expected error class, message regex).
API_CASES: dict[str, tuple[Callable[[Path], object], type[Exception], str]] = {
    "stored steps unsorted": (lambda t: _damaged_run(t, step=[0, 2, 1, 4, 8, 16]).steps, StoreError, r"steps must be >= 0 and strictly increasing"),
    "stored steps duplicated": (lambda t: _damaged_run(t, step=[0, 1, 1, 4, 8, 16]).coord("step"), StoreError, r"strictly increasing"),
    "open_store with a URL that is not a path": (lambda t: tokdyn.open_store(123, mode="r"), InputError, r"path or an fsspec URL"),
    "open_store with an unknown mode": (lambda t: tokdyn.open_store(t / "x.zarr", mode="x"), InputError, r"mode must be"),
    "open_store of a missing store for reading": (lambda t: tokdyn.open_store(t / "x.zarr", mode="r"), tokdyn.NotAStoreError, r"no tokdyn store"),
    "append losses of object dtype": (lambda t: _writer(t).append(np.array([1.0, None] * 8, dtype=object), step=0), InputError, r"numbers"),
    "append losses of the wrong shape": (lambda t: _writer(t).append(np.ones(5), step=0), InputError, r"shape \(16,\)"),
    "append with a NaN axis value": (lambda t: _writer(t).append(np.ones(16), step=0, axis_value=np.nan), InputError, r"axis_value must be finite"),
    "append with an inf axis value": (lambda t: _writer(t).append(np.ones(16), step=0, axis_value=np.inf), InputError, r"axis_value must be finite"),
    "append a negative step": (lambda t: _writer(t).append(np.ones(16), step=-3), tokdyn.StepOrderError, r"step must be >= 0"),
    "recorder schedule with duplicate steps": (lambda t: tokdyn.record.TokenLossRecorder(torch.nn.Linear(1, 1), make_probe(), t / "r.zarr", "r", schedule=[0, 1, 1]), InputError, r"duplicate"),
    "recorder schedule with NaN": (lambda t: tokdyn.record.TokenLossRecorder(torch.nn.Linear(1, 1), make_probe(), t / "r.zarr", "r", schedule=[0, float("nan")]), InputError, r"integers"),
    "recorder with an index-only probe": (lambda t: tokdyn.record.TokenLossRecorder(torch.nn.Linear(1, 1), tokdyn.ProbeSet(None, {"sample_id": np.arange(3), "token_pos": np.ones(3)}), t / "r.zarr", "r", schedule=[0]), InputError, r"token ids"),
    "fitter with NaN in x": (lambda t: _fitter().fit(np.where(np.arange(8) == 3, np.nan, X), Y), InputError, r"x"),
    "fitter with unsorted x": (lambda t: _fitter().fit(X[::-1], Y), InputError, r"increasing"),
    "fitter with Y of the wrong width": (lambda t: _fitter().fit(X, Y[:, :5]), InputError, r"Y"),
    "fitter with Y of strings": (lambda t: _fitter().fit(X, Y.astype(str)), InputError, r"Y"),
    "fitter with a NaN threshold": (lambda t: _fitter(min_points=float("nan")).fit(X, Y), InputError, r"min_points"),
    "fit options with a negative width bound": (lambda t: tokdyn.fit.FitOptions(s_min=-1.0), InputError, r"s_min"),
    "fit_run with zero workers": (lambda t: tokdyn.fit.fit_run(_writer(t).run, workers=0), InputError, r"workers must be None or an int >= 1"),
}


@pytest.mark.parametrize("name", list(API_CASES))
def test_api_bad_input(name, tmp_path):
    call, error, message = API_CASES[name]
    with pytest.raises(error, match=message) as info:
        call(tmp_path)
    assert isinstance(info.value, TokdynError)


def test_the_catalogue_is_large_enough():
    assert len(CLI_CASES) + len(API_CASES) >= 20


# -- what is not an error: NaN and inf where they are data ----------------------------------


def test_nonfinite_losses_are_data_not_errors(tmp_path):
    """inf and NaN losses are stored as NaN and counted (recorder, writer, npz import), and the
    fitter gives such tokens a status instead of failing the block."""
    from tokdyn.fit import STATUS_CODES, fit_sigmoids
    from tokdyn.interchange import import_npz

    lm = np.ones((48, 3), np.float32) * [3, 2, 1]
    lm[0, 1], lm[1, 2], lm[2, 0] = np.inf, -np.inf, np.nan
    run = import_npz(_npz(tmp_path / "n.npz", loss_matrix=lm), tmp_path / "s.zarr")
    assert run.nonfinite() == (3, {0: 1, 1: 1, 2: 1})
    assert np.isnan(run.losses()[[1, 2, 0], [0, 1, 2]]).all()
    Yb = np.vstack([Y, np.full(8, np.nan), np.where(np.arange(8) == 2, np.inf, Y[0])])
    res = fit_sigmoids(X, Yb, backend="numpy")
    assert res.status[3] == STATUS_CODES["too_few_points"] and res.status[4] == STATUS_CODES["invalid_input"]
    assert np.isfinite(res.mu[:3]).all()


def test_an_unsafe_file_error_is_an_input_error():
    assert issubclass(UnsafeFileError, InputError) and issubclass(StoreError, TokdynError)
