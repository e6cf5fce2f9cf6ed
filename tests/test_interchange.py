"""losses.npz import/export and the CLI over the store (info, import-npz, export-npz)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

import tokdyn
from tokdyn.store import as_store
from tokdyn.cli import main
from tokdyn.errors import InputError, ProbeMismatchError, UnsafeFileError
from tokdyn.interchange import export_npz, import_npz, read_npz


def write_npz(path, n=50, k=6, axis="T", dtype=np.float32, **extra):
    rng = np.random.default_rng(0)
    lm = rng.gamma(2.0, 1.0, size=(n, k)).astype(dtype)
    lm[3, 1] = np.nan  # a missing point
    arrays = {
        "axis_values": np.array([1, 2, 4, 8, 16, 32, 64, 128, 256][:k], float),
        "loss_matrix": lm,
        "axis_name": np.array([axis]),
        "sample_id": np.arange(n) // 5,
        "token_pos": np.arange(n) % 5 + 1,
        **extra,
    }
    np.savez(path, **arrays)
    return arrays


def test_float32_roundtrip_is_exact(tmp_path):
    src = write_npz(tmp_path / "in.npz", token_text=np.array([f"t{i}" for i in range(50)]))
    run = import_npz(tmp_path / "in.npz", tmp_path / "s.zarr")
    assert run.name == "in" and run.axis == "T" and run.dtype == np.float32
    np.testing.assert_array_equal(run.steps, [1, 2, 4, 8, 16, 32])
    export_npz(as_store(tmp_path / "s.zarr").run("in"), tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz", allow_pickle=False) as out:
        assert sorted(out.files) == sorted(src)
        for key, v in src.items():
            assert out[key].dtype == v.dtype, key
            np.testing.assert_array_equal(out[key], v)  # NaN == NaN in assert_array_equal
        assert out["loss_matrix"].tobytes() == src["loss_matrix"].tobytes()  # bit for bit


def test_d_axis_import_and_second_run_into_same_store(tmp_path):
    write_npz(tmp_path / "d.npz", axis="D")
    run = import_npz(tmp_path / "d.npz", tmp_path / "s.zarr", run="budget")
    assert run.axis == "D"
    np.testing.assert_array_equal(run.axis_values, [1, 2, 4, 8, 16, 32])
    np.testing.assert_array_equal(run.steps, np.arange(6))  # D rows are numbered
    write_npz(tmp_path / "m.npz", axis="M")
    import_npz(tmp_path / "m.npz", tmp_path / "s.zarr", run="size")  # same tokens: accepted
    assert tokdyn.open_store(tmp_path / "s.zarr", mode="r").runs == ["budget", "size"]
    write_npz(tmp_path / "other.npz", n=40)
    with pytest.raises(ProbeMismatchError, match="40 tokens"):
        import_npz(tmp_path / "other.npz", tmp_path / "s.zarr")


def test_float64_kept_unless_asked(tmp_path):
    write_npz(tmp_path / "f.npz", dtype=np.float64)
    assert import_npz(tmp_path / "f.npz", tmp_path / "a.zarr").dtype == np.float64
    assert import_npz(tmp_path / "f.npz", tmp_path / "b.zarr", dtype="float16").dtype == np.float16


def test_object_arrays_refused_without_unpickling(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    arr = np.empty(1, dtype=object)
    arr[0] = Evil()
    np.savez(tmp_path / "evil.npz", axis_values=np.array([1.0]), loss_matrix=np.ones((1, 1), np.float32),
             axis_name=np.array(["T"]), meta=arr)  # fmt: skip
    with pytest.raises(UnsafeFileError, match="pickle"):
        read_npz(tmp_path / "evil.npz")
    assert not marker.exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"loss_matrix": np.ones((5, 3), np.int32)}, "float array"),
        ({"axis_values": np.array([1.0, 2.0])}, "to match loss_matrix"),
        ({"axis_values": np.array([1.0, 3.0, 2.0])}, "strictly increasing"),
        ({"axis_name": np.array(["X"])}, "axis_name"),
        ({"sample_id": np.arange(4)}, "per-token array 'sample_id'"),
    ],
)
def test_malformed_npz(tmp_path, change, message):
    arrays = {"axis_values": np.array([1.0, 2.0, 3.0]), "loss_matrix": np.ones((5, 3), np.float32), "axis_name": np.array(["T"])}
    arrays.update(change)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(InputError, match=message):
        read_npz(tmp_path / "bad.npz")


def test_missing_key_and_not_npz(tmp_path):
    np.savez(tmp_path / "a.npz", loss_matrix=np.ones((2, 2), np.float32))
    with pytest.raises(InputError, match="lacks axis_values, axis_name"):
        read_npz(tmp_path / "a.npz")
    (tmp_path / "b.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a readable npz"):
        read_npz(tmp_path / "b.npz")


# -- CLI -----------------------------------------------------------------------------------


def test_cli_import_info_export(tmp_path, capsys):
    write_npz(tmp_path / "in.npz")
    store = str(tmp_path / "s.zarr")
    assert main(["import-npz", str(tmp_path / "in.npz"), store, "--run", "r"]) == 0
    assert main(["info", store, "--json"]) == 0
    info = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert info["runs"]["r"]["shape"] == [6, 50] and info["runs"]["r"]["nonfinite_losses"] == 1
    assert main(["info", store]) == 0
    text = capsys.readouterr().out
    assert "run r" in text and "axis T" in text and "index-only" in text
    assert main(["export-npz", store, str(tmp_path / "o.npz"), "--run", "r"]) == 0
    assert (tmp_path / "o.npz").is_file()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["info", "{tmp}/missing.zarr"], "no tokdyn store"),
        (["export-npz", "{tmp}/s.zarr", "{tmp}/o.npz", "--run", "nope"], "no run 'nope'"),
        (["export-npz", "{tmp}/s.zarr", "{tmp}/nodir/o.npz", "--run", "in"], "does not exist"),
        (["import-npz", "{tmp}/missing.npz", "{tmp}/s.zarr"], "not found"),
        (["import-npz", "{tmp}/in.npz", "{tmp}/s.zarr"], "already exists"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, capsys, argv, message):
    write_npz(tmp_path / "in.npz")
    import_npz(tmp_path / "in.npz", tmp_path / "s.zarr")
    capsys.readouterr()
    code = main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 1
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_console_script_exits_nonzero_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tokdyn.cli", "info", str(tmp_path / "x.zarr")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "no tokdyn store" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_name_or_partial_import_leaves_the_store_usable(tmp_path):
    write_npz(tmp_path / "bad.npz", **{"doc id": np.arange(50)})
    with pytest.raises(InputError, match="not allowed"):
        import_npz(tmp_path / "bad.npz", tmp_path / "s.zarr")
    write_npz(tmp_path / "good.npz")
    run = import_npz(tmp_path / "good.npz", tmp_path / "s.zarr")  # nothing half-made in the way
    assert run.n_committed == 6


def test_partial_import_is_removed(tmp_path, monkeypatch):
    write_npz(tmp_path / "in.npz")
    import_npz(tmp_path / "in.npz", tmp_path / "s.zarr", run="first")
    calls = {"n": 0}
    real = tokdyn.RunWriter.append

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tokdyn.RunWriter, "append", failing)
    with pytest.raises(OSError):
        import_npz(tmp_path / "in.npz", tmp_path / "s.zarr", run="second")
    monkeypatch.setattr(tokdyn.RunWriter, "append", real)
    assert tokdyn.open_store(tmp_path / "s.zarr", mode="r").runs == ["first"]
    assert import_npz(tmp_path / "in.npz", tmp_path / "s.zarr", run="second").n_committed == 6


def test_unsigned_decreasing_axis_and_bytes_axis_name(tmp_path):
    arrays = {"axis_values": np.array([10, 5], np.uint64), "loss_matrix": np.ones((3, 2), np.float32), "axis_name": np.array(["T"])}
    np.savez(tmp_path / "u.npz", **arrays)
    with pytest.raises(InputError, match="strictly increasing"):
        read_npz(tmp_path / "u.npz")
    arrays.update(axis_values=np.array([5, 10], np.uint64), axis_name=np.array([b"D"]))
    np.savez(tmp_path / "b.npz", **arrays)
    assert import_npz(tmp_path / "b.npz", tmp_path / "s.zarr").axis == "D"


def test_cli_bad_device_is_one_line(tmp_path, capsys):
    code = main(["demo", "--out", str(tmp_path / "d"), "--device", "cpuu", "--steps", "2"])
    err = capsys.readouterr().err
    assert code == 1 and "not a torch device" in err and "Traceback" not in err
