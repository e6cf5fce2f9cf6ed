"""import-npz / export-npz round trips keep every field of the file exactly: the dtype (byte order
included) and every value of the axis values, the loss matrix (NaN as NaN), the axis name and the
per-token arrays; axis values the store cannot hold exactly are refused, never rounded; a zip
whose members are ambiguous, or per-token numbers the store cannot hold, are one error line."""

from __future__ import annotations

import re
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn.errors import InputError
from tokdyn.interchange import export_npz, import_npz, read_npz

AXIS_DTYPES = ["<i8", ">i8", "<i4", "<i2", "<u1", "<u2", "<u4", "<u8", ">u8", "<f2", "<f4", ">f4", "<f8", ">f8"]
LOSS_DTYPES = ["<f2", "<f4", ">f4", "<f8", ">f8"]
TOKEN_DTYPES = ["<i8", ">i4", "<u2", "<u8", "|b1", "<f2", "<f4", ">f8", "<U3"]


def _axis_values(draw, dtype: np.dtype, k: int, axis: str) -> np.ndarray:
    """k strictly increasing values of ``dtype`` that a float64 holds exactly (or, on T, whole
    numbers >= 0 that int64 steps hold)."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo = 0 if axis == "T" or dtype.kind == "u" else max(int(info.min), -(2**53))
        hi = min(int(info.max), 2**63 - 1 if axis == "T" else 2**53)
        values = draw(st.lists(st.integers(lo, hi), min_size=k, max_size=k, unique=True))
        return np.array(sorted(values), dtype=dtype)
    finite = st.floats(-1e4 if axis != "T" else 0, 1e4, width={2: 16, 4: 32, 8: 64}[dtype.itemsize])
    values = draw(st.lists(finite, min_size=k, max_size=k, unique_by=lambda v: float(np.asarray(v, dtype))))
    out = np.array(sorted(values), dtype=dtype)
    return out if np.all(out[1:] > out[:-1]) else np.arange(k, dtype=dtype) + 1


@st.composite
def npz_files(draw):
    n, k = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    axis = draw(st.sampled_from(["T", "D", "M"]))
    ax = _axis_values(draw, np.dtype(draw(st.sampled_from(AXIS_DTYPES))), k, axis)
    ldt = np.dtype(draw(st.sampled_from(LOSS_DTYPES)))
    losses = draw(st.lists(st.floats(0, 20, width=16) | st.just(float("nan")), min_size=n * k, max_size=n * k))
    arrays = {"axis_values": ax, "loss_matrix": np.array(losses, ldt).reshape(n, k),
              "axis_name": np.array([axis], dtype=draw(st.sampled_from(["<U1", "|S1"])))}  # fmt: skip
    for j in range(draw(st.integers(0, 3))):
        tdt = np.dtype(draw(st.sampled_from(TOKEN_DTYPES)))
        if tdt.kind == "U":
            v = np.array(draw(st.lists(st.text("ab<&é", max_size=3), min_size=n, max_size=n)), tdt)
        elif tdt.kind == "b":
            v = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), tdt)
        elif tdt.kind == "f":
            v = np.array(draw(st.lists(st.floats(-1e3, 1e3, width=16), min_size=n, max_size=n)), tdt)
        else:
            info = np.iinfo(tdt)
            v = np.array(draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n)), tdt)
        arrays[f"field{j}"] = v
    return arrays


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def _load(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays=npz_files())
def test_import_then_export_keeps_every_field_exactly(arrays, tmp_path_factory):
    d = tmp_path_factory.mktemp("rt")
    np.savez(d / "in.npz", **arrays)
    import_npz(d / "in.npz", d / "s.zarr", run="r")
    out = export_npz(tokdyn.open_store(d / "s.zarr", mode="r").run("r"), d / "out.npz")
    got = _load(out)
    for key, v in arrays.items():
        assert _same(got[key], v), (key, v.dtype, got[key].dtype, v, got[key])
    # and again: export -> import -> export is the identity on the exported file
    import_npz(out, d / "s2.zarr", run="r")
    again = _load(export_npz(tokdyn.open_store(d / "s2.zarr", mode="r").run("r"), d / "again.npz"))
    assert got.keys() == again.keys()
    for key in got:
        assert _same(again[key], got[key]), key


@pytest.mark.parametrize("top", [2**53 + 1, 2**63 - 512, 2**63 - 1])  # not a float64; a float64 of 2^63
def test_int64_axis_values_come_back_as_int64(tmp_path, top):
    ax = np.array([1, 10, 100, top], np.int64)
    np.savez(tmp_path / "a.npz", axis_values=ax, loss_matrix=np.ones((3, 4), np.float32), axis_name=np.array(["T"]))
    import_npz(tmp_path / "a.npz", tmp_path / "s.zarr", run="r")
    got = _load(export_npz(tokdyn.open_store(tmp_path / "s.zarr").run("r"), tmp_path / "b.npz"))["axis_values"]
    assert got.dtype == np.int64 and np.array_equal(got, ax)


@pytest.mark.parametrize("axis", ["D", "M"])
@pytest.mark.parametrize("ax", [np.array([1, 2**53 + 1], np.int64), np.array([1, 2**64 - 1], np.uint64),
                                np.array([1, 2**53, 2**53 + 1], np.int64)])  # fmt: skip
def test_axis_values_a_float64_cannot_hold_are_refused_not_rounded(tmp_path, axis, ax):
    np.savez(tmp_path / "a.npz", axis_values=ax, loss_matrix=np.ones((3, ax.size), np.float32), axis_name=np.array([axis]))
    # the values written as numbers, as the user gave them (not numpy's np.int64(...))
    said = rf"axis_values\[{ax.size - 1}\] = {int(ax[-1])} \({ax.dtype}\) cannot be stored exactly: .* reads it as {re.escape(str(float(ax[-1])))}$"
    with pytest.raises(InputError, match=said):
        read_npz(tmp_path / "a.npz")
    assert not (tmp_path / "s.zarr").exists()


def test_a_member_twice_in_the_zip_is_refused(tmp_path):
    import io

    def npy(a):
        b = io.BytesIO()
        np.save(b, a)
        return b.getvalue()

    with pytest.warns(UserWarning), zipfile.ZipFile(tmp_path / "a.npz", "w") as z:
        z.writestr("axis_values.npy", npy(np.array([1.0, 2.0])))
        z.writestr("loss_matrix.npy", npy(np.ones((2, 2), np.float32)))
        z.writestr("axis_name.npy", npy(np.array(["T"])))
        z.writestr("axis_values.npy", npy(np.array([10.0, 20.0])))  # np.load takes this one
    with pytest.raises(InputError, match="appears twice"):
        read_npz(tmp_path / "a.npz")


def test_per_token_numbers_the_store_cannot_hold_are_one_error(tmp_path, capsys):
    from tokdyn.cli import main

    np.savez(tmp_path / "a.npz", axis_values=np.array([1.0, 2.0]), loss_matrix=np.ones((2, 2), np.float32),
             axis_name=np.array(["T"]), extra=np.zeros(2, np.longdouble))  # fmt: skip
    if np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("long double is float64 here")
    assert main(["import-npz", str(tmp_path / "a.npz"), str(tmp_path / "s.zarr")]) == 1
    err = capsys.readouterr().err
    assert "unsupported dtype" in err and "internal error" not in err and len(err.strip().splitlines()) == 1


def test_infinite_losses_are_said_to_become_nan(tmp_path):
    lm = np.ones((2, 2), np.float32)
    lm[0, 0] = np.inf
    np.savez(tmp_path / "a.npz", axis_values=np.array([1.0, 2.0]), loss_matrix=lm, axis_name=np.array(["T"]))
    with pytest.warns(UserWarning, match="1 infinite losses"):
        import_npz(tmp_path / "a.npz", tmp_path / "s.zarr", run="r")
    got = _load(export_npz(tokdyn.open_store(tmp_path / "s.zarr").run("r"), tmp_path / "b.npz"))["loss_matrix"]
    assert np.isnan(got[0, 0]) and np.array_equal(got[1], lm[1])


@pytest.mark.parametrize("name", ["axis_values", "loss_matrix", "axis_name", "probe_domains", "probe_tokens"])
def test_a_probe_array_named_like_a_member_of_the_file_is_refused_not_written_over_it(tmp_path, name):
    arrays = {"sample_id": np.arange(4, dtype=np.int32), "token_pos": np.ones(4, np.int32), name: np.array([5.0, 6, 7, 8])}
    with pytest.raises(InputError, match=name):  # a new probe refuses the name; a store made before may hold it
        tokdyn.ProbeSet(None, arrays)
    s = tokdyn.open_store(tmp_path / "s.zarr", tokdyn.ProbeSet(None, arrays, stored=True), mode="w")
    with s.create_run("r", capacity=4).writer() as w:
        for j in range(4):
            w.append(np.ones(4, np.float32), step=j + 1)
    with pytest.raises(InputError, match=name):
        export_npz(s.run("r"), tmp_path / "o.npz")
    assert not (tmp_path / "o.npz").exists()


def test_a_float16_step_axis_imports_without_a_warning(tmp_path):
    import warnings

    ax = np.array([1, 10, 100, 2048], np.float16)
    np.savez(tmp_path / "a.npz", axis_values=ax, loss_matrix=np.ones((3, 4), np.float32), axis_name=np.array(["T"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow in a cast was printed to the user
        import_npz(tmp_path / "a.npz", tmp_path / "s.zarr", run="r")
    assert np.array_equal(tokdyn.open_store(tmp_path / "s.zarr").run("r").steps, [1, 10, 100, 2048])


def test_per_token_bytes_are_refused_with_what_to_do(tmp_path, capsys):
    """numpy's bytes strings (`S`) are not the unicode strings the store holds: refused in one
    line that says so, and the same labels as unicode are imported."""
    from tokdyn.cli import main

    base = dict(axis_values=np.array([1.0, 2.0]), loss_matrix=np.ones((2, 2), np.float32), axis_name=np.array(["T"]))
    np.savez(tmp_path / "a.npz", **base, lab=np.array([b"ab0", b"ab1"]))
    assert main(["import-npz", str(tmp_path / "a.npz"), str(tmp_path / "s.zarr")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unsupported dtype |S3" in err and "these are bytes: decode them, e.g. arr.astype(str)" in err
    assert not (tmp_path / "s.zarr").exists()
    np.savez(tmp_path / "b.npz", **base, lab=np.array([b"ab0", b"ab1"]).astype(str))
    assert main(["import-npz", str(tmp_path / "b.npz"), str(tmp_path / "s.zarr")]) == 0
