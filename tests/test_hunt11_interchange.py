"""import-npz / export-npz and `tokdyn info` as hostile clients and unusual researchers use them:
a header declaring more data than its member holds is refused before any store is made; the
probe members (token ids, domain and document names, the tokenizer spec) come back as the file
held them; float128 axis values keep their dtype; a T file whose fractional axis values are huge
imports with numbered steps; the store commands' lines say what to do and print stored text
inert; the import takes a demo folder and refuses a memory:// store."""

from __future__ import annotations

import io
import json
import shutil
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn._checks import log_tie
from tokdyn.cli import main
from tokdyn.errors import InputError, RunExistsError
from tokdyn.interchange import export_npz, import_npz

from reliability_fixtures import cli_error_line


def _arrays(n: int = 6, k: int = 3, **over) -> dict[str, np.ndarray]:
    base = {"axis_values": np.array([1, 2, 4, 8, 16][:k]), "loss_matrix": np.arange(n * k, dtype=np.float32).reshape(n, k) / 7,
            "axis_name": np.array(["T"])}  # fmt: skip
    return {**base, **over}


def _npz(path: Path, **over) -> Path:
    np.savez(path, **_arrays(**over))
    return path


def _load(path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def _round_trip(tmp_path: Path, name: str = "in", **over) -> tuple[dict, dict]:
    src = _npz(tmp_path / f"{name}.npz", **over)
    import_npz(src, tmp_path / f"{name}.zarr", run="r")
    out = export_npz(tokdyn.open_store(tmp_path / f"{name}.zarr", mode="r").run("r"), tmp_path / f"{name}-out.npz")
    return _load(src), _load(out)


def _cli(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- a header declaring more than its member holds --------------------------------------------


def _claiming_header(n: int) -> bytes:
    """The ``.npy`` header of a ``[n, 1]`` float32 loss_matrix."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False, "shape": (n, 1)})
    return head.getvalue()


def _claiming(path: Path, n: int, *, method: int) -> Path:
    """A losses.npz, its members compressed by zip ``method``, whose loss_matrix header declares
    ``[n, 1]`` float32 but whose data is 64 bytes."""
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for key, value in {"axis_values": np.array([1.0]), "axis_name": np.array(["T"])}.items():
            b = io.BytesIO()
            np.save(b, value)
            zf.writestr(f"{key}.npy", b.getvalue())
        zf.writestr("loss_matrix.npy", _claiming_header(n) + bytes(64))
    return path


def _lie_about_size(path: Path, member: str, size: int) -> Path:
    """``path`` with the uncompressed size its zip directory gives ``member`` replaced by ``size``
    (in the central directory, which zipfile reads), its data unchanged."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        start = zf.start_dir
    at = data.index(b"PK\x01\x02" + b"", start)
    while True:
        name_len = int.from_bytes(data[at + 28 : at + 30], "little")
        extra, comment = int.from_bytes(data[at + 30 : at + 32], "little"), int.from_bytes(data[at + 32 : at + 34], "little")
        if data[at + 46 : at + 46 + name_len].decode() == member:
            data[at + 24 : at + 28] = size.to_bytes(4, "little")
            break
        at += 46 + name_len + extra + comment
    path.write_bytes(bytes(data))
    return path


def _import_peak(path, tmp_path, capsys):
    """``tokdyn import-npz path``: its exit code, its one error line, and the peak of Python
    memory it held (tracemalloc)."""
    tracemalloc.start()
    try:
        code, _, err = _cli(["import-npz", path, tmp_path / "s.zarr"], capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return code, cli_error_line(err), peak


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "compressed"])
def test_a_header_declaring_more_than_its_member_holds_is_refused_before_any_store(tmp_path, capsys, method):
    """A 600-byte file declaring 5,000,000 tokens built a 5,000,000-token probe (and wrote its
    store) before its data was found missing; 2e8 tokens took 1.7 GB and 12 s, 2e9 would have
    taken the machine. The zip directory says how much each member holds: refused from it."""
    path = _claiming(tmp_path / "claims.npz", 5_000_000, method=method)
    code, line, peak = _import_peak(path, tmp_path, capsys)
    assert code == 1 and "loss_matrix is cut short" in line and "20,000,000 bytes its header declares" in line, line
    assert peak < 8 * 2**20, f"{peak / 2**20:.0f} MiB held for a file of {path.stat().st_size} bytes"
    assert not (tmp_path / "s.zarr").exists()


def test_a_zip_directory_claiming_more_than_deflate_can_hold_is_refused(tmp_path, capsys):
    """The directory's size is the member's word; a deflated member holds at most ~1032 bytes per
    stored byte, so a directory claiming more is refused from the bound as well."""
    path = _lie_about_size(_claiming(tmp_path / "lie.npz", 5_000_000, method=zipfile.ZIP_DEFLATED), "loss_matrix.npy", 2**31)
    code, line, peak = _import_peak(path, tmp_path, capsys)
    assert code == 1 and "cut short" in line and "compressed data cannot hold" in line, line
    assert peak < 8 * 2**20 and not (tmp_path / "s.zarr").exists()


def test_a_highly_compressible_real_matrix_still_imports(tmp_path):
    """Zeros deflate about 1000:1, within the bound: a real file is never refused by it."""
    path = tmp_path / "zeros.npz"
    np.savez_compressed(path, **_arrays(n=300_000, k=2, loss_matrix=np.zeros((300_000, 2), np.float32)))
    r = import_npz(path, tmp_path / "s.zarr", run="r")
    assert r.n_committed == 2 and float(np.abs(r.losses()).max()) == 0.0


def test_a_member_that_is_no_array_is_named_without_an_exception_type(tmp_path, capsys):
    """The line read `... is not a readable npz file: InputError: ...: member 'readme.txt' is not an array`."""
    path = _npz(tmp_path / "in.npz")
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("readme.txt", "hello")
    code, _, err = _cli(["import-npz", path, tmp_path / "s.zarr"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "member 'readme.txt' is not an array" in line and "InputError" not in line, line


# -- the probe members come back as the file held them ------------------------------------------


TOKENS = np.array([[5, 1, 2, 3], [7, 4, 5, 6]])  # 2 sequences x 3 targets: 6 tokens
SPEC = {"kind": "byte", "vocab_size": 257, "eot_id": 256}


@pytest.mark.parametrize("member, value", [
    ("probe_tokens", TOKENS),  # int64: what np.array of a list gives
    ("probe_tokens", TOKENS.astype(np.uint16)),
    ("probe_tokens", TOKENS.astype(">i4")),
    ("probe_domains", np.array(["a", "bb"], dtype="<U10")),
    ("probe_domains", np.array(["a", "bb"], dtype=">U2")),
    ("probe_documents", np.array(["x.py", "y.py"], dtype="<U32")),
    ("probe_tokenizer", np.array(['{"vocab_size": 257,   "kind": "byte", "eot_id": 256}'])),
    ("probe_tokenizer", np.array(json.dumps(SPEC, sort_keys=True))),  # 0-d
    ("probe_tokenizer", np.array([[json.dumps(SPEC, sort_keys=True)]])),
    ("probe_tokenizer", np.array([json.dumps(SPEC, sort_keys=True)], dtype="<U100")),
    ("probe_tokenizer", np.array(['{"kind": "bpé", "vocab_size": 300}'])),  # json.dumps escapes é
], ids=["tokens-int64", "tokens-uint16", "tokens-big-endian", "domains-wide", "domains-big-endian", "documents-wide",
        "tokenizer-spacing", "tokenizer-0d", "tokenizer-2d", "tokenizer-wide", "tokenizer-non-ascii"])  # fmt: skip
def test_probe_members_come_back_as_the_file_held_them(tmp_path, member, value):
    """export wrote probe_tokens as int32, the names as their narrowest native width and the
    tokenizer spec as json.dumps(sort_keys=True) in [1]: int64 token ids came back int32, a
    spec's text came back reworded (`"bp\\u00e9"` for `"bpé"`)."""
    over = {member: value}
    if member == "probe_domains":
        over["domain"] = np.array([0, 1, 1, 0, 0, 1])
    if member == "probe_documents":
        over["doc_id"] = np.array([0, 0, 0, 1, 1, 1])
    before, after = _round_trip(tmp_path, **over)
    for key, v in before.items():
        assert _same(v, after[key]), (key, v.dtype, v.shape, after[key].dtype, after[key].shape, v, after[key])


def test_probe_members_export_as_the_probe_holds_them_when_the_layout_is_damaged(tmp_path):
    """A run's recorded layout is what its attributes say: garbage there (a damaged store) falls
    back to the probe's own arrays, never to an error or a huge allocation."""
    _round_trip(tmp_path, probe_tokens=TOKENS, probe_tokenizer=np.array([json.dumps(SPEC)]))
    path = tmp_path / "in.zarr" / "runs" / "r" / "zarr.json"
    meta = json.loads(path.read_text())
    meta["attributes"]["tokdyn_run"]["npz_layout"]["probe"] = {
        "probe_tokens": "<U5", "probe_domains": [1], "probe_tokenizer": ["<U2000000000", [1] * 40, 7]}
    path.write_text(json.dumps(meta))
    out = _load(export_npz(tokdyn.open_store(tmp_path / "in.zarr", mode="r").run("r"), tmp_path / "again.npz"))
    assert out["probe_tokens"].dtype == np.int32 and np.array_equal(out["probe_tokens"], TOKENS)
    assert json.loads(str(out["probe_tokenizer"][0])) == SPEC


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize < 16, reason="no 16-byte long double on this platform")
def test_float128_axis_values_keep_their_dtype(tmp_path):
    """A float128 loss matrix is refused; float128 axis values that a float64 holds exactly were
    taken and came back float64."""
    before, after = _round_trip(tmp_path, axis_values=np.array([1, 2.5, 4], np.longdouble), axis_name=np.array(["D"]))
    assert _same(before["axis_values"], after["axis_values"]), after["axis_values"].dtype


def test_a_t_axis_of_fractional_values_imports_whatever_their_size(tmp_path):
    """Only whole values >= 0 become steps; the others number the rows. A fractional T axis
    reaching 1e300 was refused as "a step on T must be below 2^63"."""
    r = import_npz(_npz(tmp_path / "in.npz", axis_values=np.array([0.0, 1.5, 1e300])), tmp_path / "s.zarr", run="r")
    assert r.steps.tolist() == [0, 1, 2] and r.axis_values.tolist() == [0.0, 1.5, 1e300]
    with pytest.raises(InputError, match="below 2\\^63"):  # whole values would be steps: still refused
        import_npz(_npz(tmp_path / "w.npz", axis_values=np.array([0.0, 2.0, 1e300])), tmp_path / "w.zarr", run="r")


# -- round trips, property-based ----------------------------------------------------------------


@st.composite
def probe_files(draw):
    """A losses.npz carrying a probe: token ids, domains, a tokenizer spec, each in a dtype and
    form a researcher might write."""
    s, c, k = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    n = s * c
    ids = np.array(draw(st.lists(st.integers(0, 255), min_size=s * (c + 1), max_size=s * (c + 1)))).reshape(s, c + 1)
    axis = draw(st.sampled_from("TDM"))
    ax = np.array(sorted(draw(st.lists(st.integers(0, 10**6), min_size=k, max_size=k, unique=True))))
    losses = draw(st.lists(st.floats(0, 20, width=16) | st.just(float("nan")), min_size=n * k, max_size=n * k))
    arrays = {"axis_values": ax.astype(draw(st.sampled_from(["<i8", "<f8", ">f4", "<u4"]))),
              "loss_matrix": np.array(losses, draw(st.sampled_from(["<f2", "<f4", ">f8"]))).reshape(n, k),
              "axis_name": np.array([axis]),
              "probe_tokens": ids.astype(draw(st.sampled_from(["<i8", "<i4", ">i4", "<u2", "<i2"])))}  # fmt: skip
    if draw(st.booleans()):
        names = draw(st.lists(st.text("abé_", min_size=1, max_size=4), min_size=1, max_size=3, unique=True))
        arrays["probe_domains"] = np.array(names, dtype=draw(st.sampled_from(["<U8", ">U8", "<U4"])))
        arrays["domain"] = np.array(draw(st.lists(st.integers(0, len(names) - 1), min_size=n, max_size=n)))
    if draw(st.booleans()):
        spec = {"kind": "byte", "vocab_size": 256 + draw(st.integers(0, 5)), "name": draw(st.text("xé ", max_size=3))}
        text = json.dumps(spec, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1])))
        arrays["probe_tokenizer"] = np.array(text).reshape(draw(st.sampled_from([(), (1,), (1, 1)])))
    return arrays


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays=probe_files())
def test_import_then_export_gives_back_every_probe_member(arrays, tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    np.savez(d / "in.npz", **arrays)
    import_npz(d / "in.npz", d / "s.zarr", run="r")
    got = _load(export_npz(tokdyn.open_store(d / "s.zarr", mode="r").run("r"), d / "out.npz"))
    for key, v in arrays.items():
        assert _same(v, got[key]), (key, v.dtype, v.shape, got[key].dtype, got[key].shape)


@st.composite
def recorded_runs(draw):
    """A run as the recorder writes it: a probe with or without token ids, domains and a
    tokenizer; T, D or M; float16/32/64 losses with NaN; steps with or without axis values."""
    s, c, k = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    n = s * c
    if draw(st.booleans()):
        ids = np.array(draw(st.lists(st.integers(0, 255), min_size=s * (c + 1), max_size=s * (c + 1)))).reshape(s, c + 1)
        probe = tokdyn.ProbeSet.from_tokens(ids, tokenizer={"kind": "byte", "vocab_size": 257, "eot_id": 256})
    else:
        doms = draw(st.sampled_from([(), ("a",), ("a", "b")]))
        arrays = {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.zeros(n, np.int32)}
        if doms:
            arrays["domain"] = np.arange(n, dtype=np.int32) % len(doms)
        probe = tokdyn.ProbeSet(None, arrays, domains=doms)
    axis = draw(st.sampled_from("TDM"))
    steps = sorted(draw(st.lists(st.integers(0, 2**62), min_size=k, max_size=k, unique=True)))
    values = [None] * k if axis == "T" and draw(st.booleans()) else \
        sorted(draw(st.lists(st.floats(1e-3, 1e12), min_size=k, max_size=k, unique=True)))  # fmt: skip
    # values a fit's log axis cannot tell apart (999999999999.9999 and 1e12, drawn about 1 time in
    # 1,000) are no run a fit can use, and import-npz refuses them
    assume(log_tie([float(s) if v is None else v for s, v in zip(steps, values)]) is None)
    losses = np.array(draw(st.lists(st.floats(0, 70_000, width=32) | st.just(float("nan")), min_size=n * k, max_size=n * k)))
    return probe, axis, draw(st.sampled_from(["float16", "float32", "float64"])), steps, values, losses.reshape(k, n)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=recorded_runs())
def test_export_import_export_is_identical(spec, tmp_path_factory):
    probe, axis, dtype, steps, values, losses = spec
    d = tmp_path_factory.mktemp("rec")
    a = tokdyn.open_store(d / "a.zarr", probe, mode="w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float16 overflow and NaN are stored as NaN, as warned
        with a.create_run("r", axis=axis, capacity=len(steps), dtype=dtype).writer() as w:
            for j, step in enumerate(steps):
                w.append(losses[j], step=step, axis_value=values[j])
    first = export_npz(a.run("r"), d / "first.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing of the first export is dropped or rounded
        import_npz(first, d / "b.zarr", run="r")
    b = tokdyn.open_store(d / "b.zarr", mode="r")
    assert b.probe_fingerprint == a.probe_fingerprint
    second = export_npz(b.run("r"), d / "second.npz")
    assert first.read_bytes() == second.read_bytes()
    np.testing.assert_array_equal(a.run("r").losses().astype(np.float64), b.run("r").losses().astype(np.float64))
    assert np.array_equal(a.run("r").axis_values, b.run("r").axis_values)


# -- what the import says, and where it goes ----------------------------------------------------


def test_importing_into_an_existing_run_says_how_to_go_on_and_changes_nothing(tmp_path, capsys):
    """It said "resume it or choose another name": an import cannot resume a run."""
    src = _npz(tmp_path / "in.npz")
    import_npz(src, tmp_path / "s.zarr", run="r")
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "s.zarr").rglob("*"))
    code, _, err = _cli(["import-npz", src, tmp_path / "s.zarr", "--run", "r"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "already exists" in line and "resume" not in line and "--run NAME" in line, line
    with pytest.raises(RunExistsError, match="delete_run"):
        import_npz(src, tmp_path / "s.zarr", run="r")
    assert sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "s.zarr").rglob("*")) == before


def test_a_file_name_that_is_no_run_name_says_to_name_the_run(tmp_path, capsys):
    """The run is named after the file's stem: a stem with a colon or a newline was refused as
    "run name must be ...", naming a run the user never typed."""
    src = _npz(tmp_path / "run 3: lr=1e-3.npz")
    code, _, err = _cli(["import-npz", src, tmp_path / "s.zarr"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "named after the file" in line and "--run NAME" in line, line
    assert not (tmp_path / "s.zarr").exists()
    assert _cli(["import-npz", src, tmp_path / "s.zarr", "--run", "lr"], capsys)[0] == 0


def test_a_store_path_that_is_a_file_is_named_as_such(tmp_path, capsys):
    """It read `[Errno 17] File exists: 'x'`."""
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = _cli(["import-npz", _npz(tmp_path / "in.npz"), tmp_path / "notes.txt"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "is a file; a store is a folder" in line, line
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_import_npz_takes_a_folder_holding_a_store_as_the_other_store_commands_do(tmp_path, capsys):
    """`tokdyn info tokdyn-demo` and `export-npz tokdyn-demo` read the demo's store.zarr;
    `import-npz x.npz tokdyn-demo` said "no tokdyn store at tokdyn-demo"."""
    import_npz(_npz(tmp_path / "in.npz"), tmp_path / "demo" / "store.zarr", run="tiny")
    code, out, err = _cli(["import-npz", _npz(tmp_path / "more.npz"), tmp_path / "demo"], capsys)
    assert code == 0 and "store.zarr" in out, err
    assert tokdyn.open_store(tmp_path / "demo" / "store.zarr", mode="r").runs == ["more", "tiny"]
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["store.zarr"]


def test_import_npz_into_a_memory_store_is_refused(tmp_path, capsys):
    """A memory:// store is this process's: the command printed "imported ... into memory://x"
    and the run was gone when it exited."""
    code, out, err = _cli(["import-npz", _npz(tmp_path / "in.npz"), "memory://hunt11"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "memory://" in line and "lost" in line and not out, line


# -- tokdyn info --------------------------------------------------------------------------------


def test_info_prints_attribute_text_inert(tmp_path, capsys):
    """Run attributes are whatever the recording code gave: an escape sequence or a direction
    mark in a parameter count reached the terminal as it was."""
    src = _npz(tmp_path / "in.npz")
    st_ = tokdyn.open_store(tmp_path / "s.zarr", tokdyn.interchange._probe_from(tokdyn.interchange._read_npz(src, matrix=False), src), mode="w")
    with st_.create_run("r", capacity=1, attrs={"n_params_non_embedding": "12M\x1b[2J\x1b[31mfake\u202e"}).writer() as w:
        w.append(np.ones(6, np.float32), step=1)
    code, out, _ = _cli(["info", tmp_path / "s.zarr"], capsys)
    assert code == 0 and "\x1b" not in out and "\u202e" not in out and "\\x1b[2J" in out, out


def test_info_names_damaged_runs_inert_on_its_error_line(tmp_path, capsys):
    """The run lines quote a name that is not printable; the closing error line printed it raw."""
    import_npz(_npz(tmp_path / "in.npz"), tmp_path / "s.zarr", run="a\u202eb")
    (tmp_path / "s.zarr" / "runs" / "a\u202eb" / "zarr.json").unlink()
    code, out, err = _cli(["info", tmp_path / "s.zarr"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "\u202e" not in out + err and "'a\\u202eb'" in line, line


def test_info_of_a_run_with_no_rows_and_odd_names(tmp_path, capsys):
    import_npz(_npz(tmp_path / "in.npz"), tmp_path / "s.zarr", run="r")
    st_ = tokdyn.open_store(tmp_path / "s.zarr", mode="r+")
    for name in ("empty", "a b", "é", "-r"):
        st_.create_run(name, axis="D", capacity=1)
    code, out, err = _cli(["info", tmp_path / "s.zarr"], capsys)
    assert code == 0 and not err
    lines = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("run ") and "no rows" in ln}
    assert set(lines) == {"empty", "a", "é", "-r"} and "0 x 6" in lines["empty"]
    code, _, err = _cli(["export-npz", tmp_path / "s.zarr", tmp_path / "o.npz", "--run=-r"], capsys)
    assert code == 1 and "no committed rows" in cli_error_line(err)
    shutil.rmtree(tmp_path / "s.zarr")
