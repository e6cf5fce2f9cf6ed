"""`tokdyn import-npz` on a large file: the loss matrix is streamed, never held whole, and the
store it makes is the one the whole-matrix import made.

The import loaded the whole file (2.1 GB for 2,000,000 tokens x 200 float32 rows); now it reads
the matrix ``IMPORT_TOKENS`` tokens at a time, holding a group of rows of ``IMPORT_BYTES``
(tokdyn/interchange.py). Each store is compared file by file with the one the old route makes
(the whole matrix loaded, a column appended per row), at slice and group sizes below, at and
above the file's, for stored and compressed files, C and Fortran order, several dtypes and byte
orders; and damaged members are one error line and no store.
"""

from __future__ import annotations

import io
import os
import tracemalloc
import uuid
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

import tokdyn
import tokdyn.interchange as interchange
import tokdyn.store.store as store_module
from tokdyn.cli import main
from tokdyn.errors import InputError
from tokdyn.interchange import export_npz, import_npz

N, K = 53, 7  # a prime number of tokens: no slice size divides it


def _matrix(dtype: str, n: int = N, k: int = K, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lm = rng.gamma(2.0, 1.0, size=(n, k)).astype(np.float64)
    lm[3, 1], lm[5, 2], lm[7, 6] = np.nan, np.inf, -np.inf  # missing, and infinite both ways
    if np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize == 8:
        lm[9, 0] = 1e6  # beyond float16: inf (stored as NaN) when imported with --dtype float16
    out = lm.astype(dtype)
    if np.dtype(dtype).itemsize == 4:  # a NaN of another bit pattern: the store keeps the one NaN
        bits = out.view(np.dtype(dtype).byteorder + "u4" if np.dtype(dtype).byteorder in "<>" else "u4")
        bits[11, 3] = 0x7FC00001
    return out


def _write(path: Path, lm: np.ndarray, *, compressed: bool = False, fortran: bool = False) -> Path:
    n, k = lm.shape
    arrays = {
        "axis_values": np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512][:k], np.int64),
        "loss_matrix": np.asfortranarray(lm) if fortran else np.ascontiguousarray(lm),
        "axis_name": np.array(["T"]),
        "sample_id": np.arange(n) // 4,
        "token_pos": np.arange(n) % 4 + 1,
    }
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    with np.load(path) as z:  # the file holds the order asked for
        m = z["loss_matrix"]
        assert m.flags.f_contiguous == fortran or k == 1, "np.save wrote another order"
    return path


def _whole_matrix(p, header, w, steps, axis_values):
    """The import before streaming: the whole matrix loaded, then a column appended per row."""
    with np.load(p, allow_pickle=False) as z:
        lm = z["loss_matrix"]
    for j in range(lm.shape[1]):
        w.append(lm[:, j], step=int(steps[j]), axis_value=float(axis_values[j]), wall_time=np.nan, warn_nonfinite=False)
    return int(np.isinf(lm).sum())


def _files(root: Path) -> dict[str, bytes]:
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


@pytest.fixture
def same_ids(monkeypatch):
    """The run's random id (its checksums' salt) and the creation times fixed, so two stores
    made of the same file are the same bytes."""
    monkeypatch.setattr(store_module.uuid, "uuid4", lambda: uuid.UUID(int=12345))
    monkeypatch.setattr(store_module, "utc_now", lambda: "2000-01-01T00:00:00+00:00")


def _import(monkeypatch, path, url, dtype, *, tokens=None, rows=None, whole=False):
    with monkeypatch.context() as m:
        if whole:
            m.setattr(interchange, "_import_matrix", _whole_matrix)
        if tokens is not None:
            m.setattr(interchange, "IMPORT_TOKENS", tokens)
        if rows is not None:
            with np.load(path) as z:
                itemsize = z["loss_matrix"].dtype.itemsize
            m.setattr(interchange, "IMPORT_BYTES", rows * N * itemsize + itemsize - 1)  # exactly `rows` rows a group
        with pytest.warns(UserWarning, match="2 infinite losses"):
            return import_npz(path, url, dtype=dtype)


CASES = [  # file dtype, --dtype
    ("<f4", None),
    (">f4", None),  # big-endian: stored as float32
    ("<f2", None),
    ("<f8", None),
    (">f8", "float16"),  # 1e6 overflows float16: stored as NaN, as before
    ("<f4", "float64"),
]


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "compressed"])
@pytest.mark.parametrize("fortran", [False, True], ids=["C", "F"])
@pytest.mark.parametrize("dtype,as_dtype", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_a_streamed_import_makes_the_store_the_whole_matrix_made(tmp_path, monkeypatch, same_ids, compressed, fortran, dtype, as_dtype):
    path = _write(tmp_path / "in.npz", _matrix(dtype), compressed=compressed, fortran=fortran)
    _import(monkeypatch, path, tmp_path / "whole.zarr", as_dtype, whole=True)
    want = _files(tmp_path / "whole.zarr")
    assert any("/loss/" in key for key in want) and any("commits" in key for key in want)
    # slices smaller than, equal to and larger than the file; groups of one row, some, all
    for i, (tokens, rows) in enumerate([(5, 1), (N, 3), (10 * N, K), (1, 2), (None, None)]):
        url = tmp_path / f"s{i}.zarr"
        run = _import(monkeypatch, path, url, as_dtype, tokens=tokens, rows=rows)
        assert run.n_committed == K
        got = _files(url)
        assert sorted(got) == sorted(want), (tokens, rows)
        assert [key for key in want if got[key] != want[key]] == [], (tokens, rows)


def test_an_imported_file_still_exports_as_it_came(tmp_path, monkeypatch):
    """Import then export, a slice of 4 tokens and 2 rows at a time: every member back."""
    monkeypatch.setattr(interchange, "IMPORT_TOKENS", 4)
    monkeypatch.setattr(interchange, "IMPORT_BYTES", 2 * N * 4)
    lm = np.random.default_rng(1).gamma(2.0, 1.0, (N, K)).astype(">f4")
    lm[3, 1] = np.nan
    path = _write(tmp_path / "in.npz", lm, compressed=True)
    run = import_npz(path, tmp_path / "s.zarr")
    export_npz(run, tmp_path / "out.npz")
    with np.load(path) as a, np.load(tmp_path / "out.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "compressed"])
@pytest.mark.parametrize("fortran", [False, True], ids=["C", "F"])
def test_the_loss_matrix_is_never_held_whole(tmp_path, monkeypatch, compressed, fortran):
    """The largest memory the import allocates (numpy's and Python's, traced) stays a fraction
    of the matrix (32 MB; about 7 MB here); the whole-matrix import allocated all of it. No read
    of the member returns more than a slice."""
    n, k = 200_000, 40
    lm = np.random.default_rng(2).gamma(2.0, 1.0, (n, k)).astype(np.float32)
    arrays = {"axis_values": np.arange(1, k + 1, dtype=np.int64), "loss_matrix": np.asfortranarray(lm) if fortran else lm,
              "axis_name": np.array(["T"])}  # fmt: skip
    (np.savez_compressed if compressed else np.savez)(tmp_path / "in.npz", **arrays)
    del lm, arrays
    monkeypatch.setattr(interchange, "IMPORT_TOKENS", 4096, raising=False)  # (not raising: this runs on the old module too)
    monkeypatch.setattr(interchange, "IMPORT_BYTES", 4 * n * 4, raising=False)  # four rows of the run at a time
    largest = {"read": 0}
    real = zipfile.ZipExtFile.read

    def read(self, size=-1):
        data = real(self, size)
        if self.name == "loss_matrix.npy":
            largest["read"] = max(largest["read"], len(data))
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", read)
    tracemalloc.start()
    try:
        run = import_npz(tmp_path / "in.npz", tmp_path / "s.zarr")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert run.n_committed == k
    matrix = n * k * 4
    assert peak < matrix / 3, f"the import allocated {peak / 1e6:.1f} MB at once for a matrix of {matrix / 1e6:.1f} MB"
    assert 0 < largest["read"] <= 4096 * k * 4 + 4096  # a slice (and zipfile's read-ahead for the header)
    np.testing.assert_array_equal(run.losses(tokens=slice(n - 5, n)), np.load(tmp_path / "in.npz")["loss_matrix"][n - 5 :].T)


def _cut_member(path: Path, out: Path, keep: int, compressed: bool) -> Path:
    """``path`` rewritten with its loss_matrix member cut to ``keep`` bytes (a consistent zip:
    the member's sizes and CRC are those of the bytes it now holds)."""
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info.filename, data[:keep] if info.filename == "loss_matrix.npy" else data)
    return out


def _cli(args, capsys):
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "compressed"])
@pytest.mark.parametrize("fortran", [False, True], ids=["C", "F"])
def test_a_cut_short_matrix_is_one_error_line_and_no_store(tmp_path, monkeypatch, capsys, compressed, fortran):
    monkeypatch.setattr(interchange, "IMPORT_TOKENS", 8, raising=False)
    monkeypatch.setattr(interchange, "IMPORT_BYTES", 2 * N * 4, raising=False)  # F: rows are stored before the cut is reached
    good = _write(tmp_path / "good.npz", _matrix("<f4"), compressed=compressed, fortran=fortran)
    bad = _cut_member(good, tmp_path / "bad.npz", 128 + (N * K - 20) * 4, compressed)  # the header, then all but 20 values
    code, err = _cli(["import-npz", bad, tmp_path / "new.zarr"], capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "bad.npz is not a readable npz file: loss_matrix is cut short" in err and f"{(N * K - 20) * 4:,} of the {N * K * 4:,} bytes" in err
    assert not (tmp_path / "new.zarr").exists()
    # into an existing store: it is left as it was (no run, no trace of one)
    with pytest.warns(UserWarning, match="infinite"):
        import_npz(good, tmp_path / "s.zarr", run="first")
    before = _files(tmp_path / "s.zarr")
    code, err = _cli(["import-npz", bad, tmp_path / "s.zarr", "--run", "second"], capsys)
    assert code == 1 and "cut short" in err and err.count("\n") == 1
    assert _files(tmp_path / "s.zarr") == before
    assert tokdyn.open_store(tmp_path / "s.zarr", mode="r").runs == ["first"]


def _damage_stream(path: Path, out: Path) -> Path:
    """``path`` (compressed) with 16 bytes past the middle of its loss_matrix member's deflate
    stream overwritten, at the first place where zlib then fails as it inflates (most places
    only change values, which the CRC-32 catches)."""
    data = bytes(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("loss_matrix.npy")
    head = info.header_offset  # the local header: 30 bytes, then the name and an extra field of its own lengths
    start = head + 30 + int.from_bytes(data[head + 26 : head + 28], "little") + int.from_bytes(data[head + 28 : head + 30], "little")
    for at in range(start + info.compress_size // 2, start + info.compress_size - 16, 37):
        damaged = data[:at] + b"\xff" * 16 + data[at + 16 :]
        try:
            with zipfile.ZipFile(io.BytesIO(damaged)) as zf:
                zf.read("loss_matrix.npy")
        except zlib.error:
            out.write_bytes(damaged)
            return out
        except zipfile.BadZipFile:
            continue
    raise AssertionError("no damage that zlib fails on")


@pytest.mark.parametrize("fortran", [False, True], ids=["C", "F"])
def test_a_damaged_compressed_stream_is_one_error_line_and_no_store(tmp_path, capsys, fortran):
    """zlib's error inflating the matrix is the file's fault, said as such (it was reported as an
    internal error, a bug); a damaged byte of a stored member fails its CRC-32, as before."""
    lm = np.round(np.random.default_rng(4).gamma(2.0, 1.0, (5000, K)), 1).astype(np.float32)  # repeats: back-references
    good = tmp_path / "good.npz"
    np.savez_compressed(good, axis_values=np.arange(1, K + 1), loss_matrix=np.asfortranarray(lm) if fortran else lm,
                        axis_name=np.array(["T"]))  # fmt: skip
    bad = _damage_stream(good, tmp_path / "bad.npz")
    code, err = _cli(["import-npz", bad, tmp_path / "new.zarr"], capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert "bad.npz is not a readable npz file: loss_matrix:" in err and "internal error" not in err
    assert not (tmp_path / "new.zarr").exists()
    stored = tmp_path / "stored.npz"
    np.savez(stored, axis_values=np.arange(1, K + 1), loss_matrix=lm, axis_name=np.array(["T"]))
    data = bytearray(stored.read_bytes())
    at = data.index(b"\x93NUMPY", data.index(b"loss_matrix.npy")) + 128 + 1000
    data[at] ^= 0xFF
    stored.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"Bad CRC-32 for file 'loss_matrix.npy'"):
        import_npz(stored, tmp_path / "new.zarr")
    assert not (tmp_path / "new.zarr").exists()
