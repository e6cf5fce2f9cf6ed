"""losses.npz import/export and the CLI over the store (info, import-npz, export-npz)."""

from __future__ import annotations

import json
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


# -- a store's whole probe survives export then import ---------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _store_with_run(path, probe, losses):
    """A store on ``probe`` holding one run whose rows are ``losses [K, N]`` at steps 1, 2, 4, ..."""
    store = tokdyn.open_store(path, probe, mode="a")
    run = store.create_run("r", axis="T", capacity=losses.shape[0], dtype=str(losses.dtype))
    w = run.writer()
    try:
        for j, row in enumerate(losses):
            w.append(row, step=2**j, axis_value=float(2**j), wall_time=np.nan, warn_nonfinite=False)
    finally:
        w.release()
    return run


def _same_probe(a, b):
    assert a.fingerprint == b.fingerprint
    assert (a.tokens is None) == (b.tokens is None)
    if a.tokens is not None:
        np.testing.assert_array_equal(a.tokens, b.tokens)
    assert sorted(a.token_arrays) == sorted(b.token_arrays)
    for key, v in a.token_arrays.items():
        assert b.token_arrays[key].dtype == v.dtype, key
        np.testing.assert_array_equal(b.token_arrays[key], v)
    assert (a.domains, a.documents, a.tokenizer) == (b.domains, b.documents, b.tokenizer)


_names = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=12)
_json = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | _names,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_names, inner, max_size=3), max_leaves=6)  # fmt: skip


@st.composite
def probes(draw):
    """Probes as `tokdyn probe` makes them (token ids, documents, domains, a tokenizer spec),
    with extra per-token arrays, or index-only ones as a plain losses.npz gives."""
    s, c = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        n = draw(st.integers(1, 24))
        arrays = {"sample_id": rng.integers(0, 5, n), "token_pos": rng.integers(0, 9, n).astype(np.int16)}
        if draw(st.booleans()):
            arrays["weight"] = rng.random(n).astype(np.float32)
        return tokdyn.ProbeSet(None, arrays)
    domains = draw(st.lists(_names, max_size=3, unique=True))
    documents = draw(st.lists(_names, max_size=4, unique=True))
    tokenizer = draw(st.dictionaries(_names, _json, max_size=4))
    vocab = draw(st.sampled_from([2, 257, 50_304, 2**31 - 1]))
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, vocab, (s, c + 1)), doc_id=rng.integers(0, len(documents) or 3, s),
                                        domain=rng.integers(0, len(domains) or 3, s), domains=domains, documents=documents, tokenizer=tokenizer)  # fmt: skip
    extra = {}
    if draw(st.booleans()):
        extra["text"] = np.array([f"t{i}é" for i in range(probe.n_tokens)])
    if draw(st.booleans()):
        extra["flag"] = rng.random(probe.n_tokens) < 0.5
    return tokdyn.ProbeSet(probe.tokens, {**probe.token_arrays, **extra}, domains=probe.domains, documents=probe.documents,
                           tokenizer=probe.tokenizer)  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(probe=probes(), k=st.integers(1, 3), dtype=st.sampled_from(["float32", "float16", "float64"]), seed=st.integers(0, 2**32 - 1))
def test_export_then_import_keeps_the_probe_and_its_fingerprint(tmp_path_factory, probe, k, dtype, seed):
    tmp = tmp_path_factory.mktemp("rt")
    losses = np.random.default_rng(seed).gamma(2.0, 1.0, (k, probe.n_tokens)).astype(dtype)
    run = _store_with_run(tmp / "a.zarr", probe, losses)
    export_npz(run, tmp / "a.npz")
    back = import_npz(tmp / "a.npz", tmp / "b.zarr", run="r")
    _same_probe(probe, tokdyn.open_store(tmp / "b.zarr").probe)
    np.testing.assert_array_equal(back.losses(), losses.astype(np.float32 if dtype == "float16" else dtype))
    np.testing.assert_array_equal(back.steps, run.steps)
    import_npz(tmp / "a.npz", tmp / "a.zarr", run="again")  # its own store takes it back
    export_npz(back, tmp / "b.npz")  # and a second trip writes the same file
    with np.load(tmp / "a.npz") as a, np.load(tmp / "b.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key


def test_an_exported_probe_store_keeps_token_ids_by_the_command_line(tmp_path, capsys):
    """The defect: export-npz then import-npz gave an index-only probe of another fingerprint,
    which the curriculum refuses (it needs token ids and the tokenizer's vocabulary size)."""
    rng = np.random.default_rng(0)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 257, (4, 9)), documents=["a.txt"],
                                        tokenizer={"kind": "byte", "vocab_size": 257, "eot_id": 256})  # fmt: skip
    _store_with_run(tmp_path / "a.zarr", probe, rng.random((3, probe.n_tokens)).astype(np.float32))
    assert main(["export-npz", str(tmp_path / "a.zarr"), str(tmp_path / "a.npz")]) == 0
    with np.load(tmp_path / "a.npz") as z:
        np.testing.assert_array_equal(z["token_id"], probe.token_arrays["token_id"])
    assert main(["import-npz", str(tmp_path / "a.npz"), str(tmp_path / "b.zarr")]) == 0
    imported = tokdyn.open_store(tmp_path / "b.zarr").probe
    assert imported.has_tokens and imported.tokenizer["vocab_size"] == 257
    assert imported.fingerprint == probe.fingerprint
    assert main(["info", str(tmp_path / "b.zarr")]) == 0
    assert probe.fingerprint in capsys.readouterr().out


def test_npz_tokens_must_match_the_store_and_the_per_token_arrays(tmp_path):
    rng = np.random.default_rng(1)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 50, (3, 5)), tokenizer={"kind": "byte"})
    export_npz(_store_with_run(tmp_path / "a.zarr", probe, np.ones((2, 12), np.float32)), tmp_path / "a.npz")
    other = tokdyn.ProbeSet.from_tokens(rng.integers(50, 99, (3, 5)))  # same shape and layout, other token ids
    tokdyn.open_store(tmp_path / "other.zarr", other, mode="a")
    with np.load(tmp_path / "a.npz") as z:
        arrays = {key: z[key] for key in z.files}
    arrays.pop("token_id")  # only the token matrix tells these probes apart
    np.savez(tmp_path / "no_ids.npz", **arrays)
    with pytest.raises(ProbeMismatchError, match="probe_tokens"):
        import_npz(tmp_path / "no_ids.npz", tmp_path / "other.zarr")
    assert tokdyn.open_store(tmp_path / "other.zarr").runs == []


@pytest.mark.parametrize(
    "change, message",
    [
        ({"probe_tokens": np.zeros((3, 4), np.int32)}, "S \\* C = 12"),
        ({"probe_tokens": np.zeros((3, 6), np.float32)}, "integer token ids"),
        ({"probe_tokens": np.full((3, 5), -1)}, "outside"),
        ({"probe_tokenizer": np.array(["{not json"])}, "JSON object"),
        ({"probe_tokenizer": np.array(["[1, 2]"])}, "JSON object"),
        ({"probe_domains": np.arange(2)}, "strings"),
        ({"token_id": np.zeros(12, np.int32) + 5}, "does not match probe_tokens"),
        ({"token_id": np.zeros(12, np.int32) - 5}, "'token_id' must hold one integer per token, >= 0"),
    ],
)
def test_malformed_probe_members(tmp_path, change, message):
    probe = tokdyn.ProbeSet.from_tokens(np.arange(15).reshape(3, 5), tokenizer={"kind": "byte"})
    export_npz(_store_with_run(tmp_path / "a.zarr", probe, np.ones((2, 12), np.float32)), tmp_path / "a.npz")
    with np.load(tmp_path / "a.npz") as z:
        arrays = {key: z[key] for key in z.files}
    np.savez(tmp_path / "bad.npz", **{**arrays, **change})
    with pytest.raises(InputError, match=message):
        import_npz(tmp_path / "bad.npz", tmp_path / "b.zarr")
    assert not (tmp_path / "b.zarr").exists()
