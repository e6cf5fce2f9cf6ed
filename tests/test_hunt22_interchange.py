"""import-npz refuses at import what no later command could use: axis values a fit's log axis
cannot tell apart (the fit's own test, shared), a ``doc_id`` past the document keys the file
names (every index field checked against what it indexes); a zip member that zipfile cannot read
(encrypted, an unknown compression method, a damaged LZMA stream) is one error line, not an
internal error; a bzip2 or LZMA member whose zip directory claims more data than it holds is
refused before a probe is built for its declared size."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn._checks import log_tie
from tokdyn.cli import main
from tokdyn.errors import InputError
from tokdyn.fit import log_axis
from tokdyn.fit.job import fit_inputs
from tokdyn.interchange import import_npz

from reliability_fixtures import cli_error_line
from test_hunt11_interchange import _claiming, _claiming_header, _import_peak, _lie_about_size

N = 6  # tokens of every file here


def _arrays(k: int = 3, **over) -> dict[str, np.ndarray]:
    base = {"axis_values": np.array([1.0, 10.0, 100.0, 1e3, 1e4, 1e5][:k]),
            "loss_matrix": np.arange(N * k, dtype=np.float32).reshape(N, k) / 7, "axis_name": np.array(["D"])}  # fmt: skip
    return {**base, **over}


def _cli(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    _, err = capsys.readouterr()
    return code, err


def _fit_refuses(values: np.ndarray) -> bool:
    """Whether the fit's own axis check (log_axis, on the positive values a fit takes) refuses."""
    try:
        log_axis(values[values > 0])
    except InputError as exc:
        assert "too close to tell apart" in str(exc), exc
        return True
    return False


# -- axis values a fit cannot tell apart ----------------------------------------------------------


def test_axis_values_one_point_on_a_log_axis_are_refused_by_the_command_line(tmp_path, capsys):
    """1e15 + 1 is 1e15 (1 + 1e-15): its log10 is 15 + 4.3e-16, nearer 15.0 than the next float
    (15 + 1.8e-15), so both are log10 15.0, one point to a fit. import-npz took the file and
    only `tokdyn fit` refused the run."""
    np.savez(tmp_path / "close.npz", **_arrays(4, axis_values=np.array([1.0, 10.0, 1e15, 1e15 + 1])))
    code, err = _cli(["import-npz", tmp_path / "close.npz", tmp_path / "s.zarr"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "axis_values[2] = 1000000000000000.0 and axis_values[3] = 1000000000000001.0" in line, line
    assert "too close to tell apart on a log scale" in line and "log10 = 15.0" in line and "tokdyn fit" in line
    assert not (tmp_path / "s.zarr").exists()  # refused before any store


@pytest.mark.parametrize("values, tie", [
    ([1.0, 10.0, 1e15, 1e15 + 1], 2),  # 15 + 4.3e-16 rounds to 15.0 (the next float is 15 + 1.8e-15)
    ([1e15, 1e15 + 1000], None),  # 15 + 4.3e-13: hundreds of floats apart
    ([0.0, 1e15, 1e15 + 1], 1),  # the 0 no fit takes: the tie is among the positive values
    ([1e300, np.nextafter(1e300, np.inf)], 0),  # neighbouring floats: 300 + 5e-17 rounds to 300.0
    ([1.0, np.nextafter(1.0, np.inf)], None),  # 0 and 9.6e-17: log10 near 0 has room (floats are dense there)
    ([1.0, 2.0, 3.0], None), ([7.0], None), ([], None),
])  # fmt: skip
def test_log_tie_finds_the_pairs_float64_gives_one_log10(values, tie):
    """The test the fit and the import share, against log10s worked out by hand."""
    assert log_tie(np.array(values)) == tie


@st.composite
def axes(draw):
    """Increasing axis values, some planted 1 to 3 floats after another (one point on a log axis
    where the value is far from 1), maybe with a 0 (step 0) in front."""
    base = sorted(draw(st.lists(st.floats(1e-6, 1e18), min_size=2, max_size=4, unique=True)))
    values = list(base)
    for v in draw(st.lists(st.sampled_from(base), max_size=2)):
        values.append(float(np.nextafter(v, np.inf) if draw(st.booleans()) else v * (1 + draw(st.integers(1, 3)) * 2.0**-52)))
    if draw(st.booleans()):
        values.append(0.0)
    return np.unique(np.array(values, np.float64)), draw(st.sampled_from("TDM"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=axes())
def test_import_refuses_exactly_the_axis_values_the_fit_refuses(drawn, tmp_path_factory):
    """The two stages agree: import-npz refuses a file iff the fit's log_axis refuses its positive
    axis values, and every run it makes gives a fit its inputs."""
    values, axis = drawn
    d = tmp_path_factory.mktemp("ax")
    np.savez(d / "in.npz", **_arrays(values.size, axis_values=values, axis_name=np.array([axis]),
                                     loss_matrix=np.ones((N, values.size), np.float32)))  # fmt: skip
    refused = _fit_refuses(values)
    try:
        run = import_npz(d / "in.npz", d / "s.zarr", run="r")
    except InputError as exc:
        assert refused, f"refused what the fit takes: {values.tolist()}: {exc}"
        assert "too close to tell apart" in str(exc) and not (d / "s.zarr").exists()
        return
    assert not refused, f"imported {values.tolist()}, which the fit refuses"
    if np.count_nonzero(values > 0) >= 2:
        rows, x = fit_inputs(run)
        assert np.array_equal(rows, np.flatnonzero(values > 0)) and np.all(np.diff(x) > 0)


# -- index fields against what they index ----------------------------------------------------------


@pytest.mark.parametrize("field, names_member", [("doc_id", "probe_documents"), ("domain", "probe_domains")])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_names=st.integers(1, 4), index=st.lists(st.integers(-2, 6), min_size=N, max_size=N))
def test_an_index_field_must_index_the_names_the_file_gives(field, names_member, n_names, index, tmp_path_factory):
    """doc_id indexes probe_documents as domain indexes probe_domains: a doc_id past the document
    keys (or negative) named no document, and was imported without a word."""
    d = tmp_path_factory.mktemp("idx")
    names = np.array([f"n{i}.py" for i in range(n_names)])
    np.savez(d / "in.npz", **_arrays(**{field: np.array(index), names_member: names}))
    inside = all(0 <= i < n_names for i in index)
    try:
        import_npz(d / "in.npz", d / "s.zarr", run="r")
    except InputError as exc:
        assert not inside, exc
        assert f"probe array {field!r} holds indices {min(index)}..{max(index)}, but there are {n_names}" in str(exc)
        assert not (d / "s.zarr").exists()
        return
    assert inside, f"imported {field} {index} with {n_names} names"
    probe = tokdyn.open_store(d / "s.zarr", mode="r").probe
    assert probe.token_arrays[field].tolist() == index


def test_an_index_field_without_names_is_a_label_and_a_stored_probe_still_opens():
    """Unnamed, doc_id is a label (any whole numbers); a probe read back from a store written
    before the check (stored=True) is not held to it; a new probe built in code is."""
    arrays = {"sample_id": np.arange(N), "token_pos": np.zeros(N, int), "doc_id": np.array([0, 7, 7, 9, 9, 9])}
    assert tokdyn.ProbeSet(None, arrays).token_arrays["doc_id"].max() == 9
    assert tokdyn.ProbeSet(None, arrays, documents=("a", "b"), stored=True).documents == ("a", "b")
    with pytest.raises(InputError, match="'doc_id' holds indices 0..9, but there are 2 document keys"):
        tokdyn.ProbeSet(None, arrays, documents=("a", "b"))
    with pytest.raises(InputError, match="'doc_id' holds indices 0..2, but there are 1 document keys"):
        tokdyn.ProbeSet.from_tokens(np.ones((3, 3), int), doc_id=np.array([0, 1, 2]), documents=["a.txt"])


def test_a_document_index_of_whole_floats_is_taken_as_before_and_a_domain_of_floats_is_not(tmp_path):
    """Before doc_id was checked, a file's doc_id of whole-number floats imported (from_tokens
    takes them too); it still does, held to the keys as integers are. A domain was never taken
    as floats, and is not."""
    files = {"floats": np.array([0.0, 0, 1, 1, 1, 1]), "fraction": np.array([0.0, 0, 1, 1, 1, 1.5])}
    for name, doc_id in files.items():
        np.savez(tmp_path / f"{name}.npz", **_arrays(doc_id=doc_id, probe_documents=np.array(["a.py", "b.py"])))
    import_npz(tmp_path / "floats.npz", tmp_path / "f.zarr", run="r")
    assert tokdyn.open_store(tmp_path / "f.zarr", mode="r").probe.token_arrays["doc_id"].tolist() == [0, 0, 1, 1, 1, 1]
    with pytest.raises(InputError, match="'doc_id' indexes 2 document keys: it must hold whole numbers.*not whole"):
        import_npz(tmp_path / "fraction.npz", tmp_path / "g.zarr", run="r")
    np.savez(tmp_path / "dom.npz", **_arrays(domain=np.array([0.0, 0, 1, 1, 1, 1]), probe_domains=np.array(["x", "y"])))
    with pytest.raises(InputError, match="'domain' indexes 2 names; expected integers, got float64"):
        import_npz(tmp_path / "dom.npz", tmp_path / "h.zarr", run="r")


def test_a_store_whose_doc_id_passes_its_keys_exports_with_a_warning_naming_the_way_back(tmp_path, capsys):
    """A store an older tokdyn wrote with doc_id past its document keys still opens and exports,
    but its file no longer imports: export says so first, in one warning line, and the import's
    line says the same way out; taking it (the keys left out) imports the file."""
    old = tokdyn.ProbeSet(None, {"sample_id": np.arange(N), "token_pos": np.zeros(N, int),
                                 "doc_id": np.array([0, 0, 5, 5, 5, 5])}, documents=("a.py", "b.py"), stored=True)  # fmt: skip
    st = tokdyn.open_store(tmp_path / "old.zarr", old, mode="a")
    with st.create_run("r").writer() as w:
        for i, step in enumerate([1, 10, 100]):
            w.append(np.arange(N, dtype=np.float32) / (i + 1), step=step)
    code, err = _cli(["export-npz", tmp_path / "old.zarr", "--run", "r", tmp_path / "out.npz"], capsys)
    assert code == 0, err
    assert len(err.strip().splitlines()) == 1 and "warning: the store's probe gives doc_id values 0..5 past its 2 " \
        "document keys" in err and "leave the keys out" in err  # fmt: skip
    code, err = _cli(["import-npz", tmp_path / "out.npz", tmp_path / "new.zarr", "--run", "r"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "'doc_id' holds indices 0..5, but there are 2 document keys" in line and "leave the keys out" in line
    assert not (tmp_path / "new.zarr").exists()
    with np.load(tmp_path / "out.npz") as f:  # the way out the line names: the keys left out
        np.savez(tmp_path / "mended.npz", **{k: f[k] for k in f.files if k != "probe_documents"})
    import_npz(tmp_path / "mended.npz", tmp_path / "new.zarr", run="r")
    assert tokdyn.open_store(tmp_path / "new.zarr", mode="r").probe.token_arrays["doc_id"].tolist() == [0, 0, 5, 5, 5, 5]


# -- zip members zipfile cannot read ---------------------------------------------------------------


def _savez(path: Path, method: int = zipfile.ZIP_STORED) -> Path:
    """_arrays() (with a per-token array) as an npz whose members use zip ``method``."""
    arrays = _arrays(extra=np.linspace(0, 1, N))
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for key, value in arrays.items():
            b = io.BytesIO()
            np.save(b, value)
            zf.writestr(f"{key}.npy", b.getvalue())
    return path


def _patch_headers(path: Path, local: tuple[int, bytes], central: tuple[int, bytes]) -> Path:
    """Every local and central header of ``path`` with the bytes given at those offsets."""
    data = bytearray(path.read_bytes())
    for sig, (off, value) in ((b"PK\x03\x04", local), (b"PK\x01\x02", central)):
        at = data.find(sig)
        while at >= 0:
            data[at + off : at + off + len(value)] = value
            at = data.find(sig, at + 4)
    path.write_bytes(bytes(data))
    return path


def _damage(path: Path, member: str, where: str) -> Path:
    """``path`` with ``member``'s compressed data damaged: at its start, the byte an LZMA member
    gives the size of its properties in; in its middle, 8 bytes."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    at, count = (start + 2, 1) if where == "start" else (start + info.compress_size // 2, 8)
    data[at : at + count] = bytes(b ^ 0x5A for b in data[at : at + count])
    path.write_bytes(bytes(data))
    return path


CASES = {  # each: the file, and what its line must say
    "encrypted": (lambda p: _patch_headers(_savez(p), (6, b"\x01\x00"), (8, b"\x01\x00")), "is encrypted"),
    "method 99": (lambda p: _patch_headers(_savez(p), (8, struct.pack("<H", 99)), (10, struct.pack("<H", 99))),
                  "compressed with zip method 99"),
    "lzma header damaged": (lambda p: _damage(_savez(p, zipfile.ZIP_LZMA), "extra.npy", "start"), "not a readable npz file"),
    "lzma data damaged": (lambda p: _damage(_savez(p, zipfile.ZIP_LZMA), "extra.npy", "middle"), "not a readable npz file"),
    "lzma matrix damaged": (lambda p: _damage(_savez(p, zipfile.ZIP_LZMA), "loss_matrix.npy", "start"), "not a readable npz file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_member_zipfile_cannot_read_is_one_line_and_no_store(tmp_path, capsys, case):
    """zipfile's own errors (a RuntimeError for a password, NotImplementedError for a method it
    lacks, lzma's LZMAError) were 'internal error in tokdyn ... a bug'."""
    make, says = CASES[case]
    path = make(tmp_path / "in.npz")
    code, err = _cli(["import-npz", path, tmp_path / "s.zarr"], capsys)
    line = cli_error_line(err)
    assert code == 1 and says in line and str(path) in line and "internal error" not in line, line
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_other_zip_methods_zipfile_reads_still_import(tmp_path, method):
    """The same arrays, stored with bzip2 or LZMA, import as the plain file does."""
    run = import_npz(_savez(tmp_path / "in.npz", method), tmp_path / "s.zarr", run="r")
    want = _arrays()
    assert np.array_equal(run.losses(), want["loss_matrix"].T) and np.array_equal(run.axis_values, want["axis_values"])
    assert np.array_equal(tokdyn.open_store(tmp_path / "s.zarr", mode="r").probe.token_arrays["extra"], np.linspace(0, 1, N))


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA], ids=["bzip2", "lzma"])
def test_a_bzip2_or_lzma_member_claiming_more_than_it_holds_is_refused_before_any_store(tmp_path, capsys, method):
    """bzip2 inflates zeros a million-fold, so the zip directory's size of such a member is its
    word alone: a 700-byte file whose directory claimed the 20,000,000 bytes its header declared
    (5,000,000 tokens) built that probe (hundreds of MB) before the data was found missing. The
    data is counted before anything is made."""
    n = 5_000_000
    declared = len(_claiming_header(n)) + 4 * n
    path = _lie_about_size(_claiming(tmp_path / "claims.npz", n, method=method), "loss_matrix.npy", declared)
    with zipfile.ZipFile(path) as zf:
        assert zf.getinfo("loss_matrix.npy").file_size == declared  # the directory claims it all
    code, line, peak = _import_peak(path, tmp_path, capsys)
    assert code == 1 and "loss_matrix is cut short: its data ends after 64 of the 20,000,000 bytes" in line, line
    # (78 MiB held before: the probe; the LZMA decompressor's own buffers are about 8 MiB)
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB held for a file of {path.stat().st_size} bytes"
    assert not (tmp_path / "s.zarr").exists()
