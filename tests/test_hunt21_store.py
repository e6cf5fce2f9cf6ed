"""Hunt 21: two processes creating one store, a new store inside another, damaged records that
are still JSON, standard output that cannot be written after the work, long file names, and a
store's size where a folder cannot be listed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tokdyn
from tokdyn.cli import main
from tokdyn.errors import InputError, StoreError
from tokdyn.fit.job import fit_run
from tokdyn.store.locks import CREATING

ROOT = Path(__file__).resolve().parents[1]


def write_npz(path, n=40, k=8):
    rng = np.random.default_rng(0)
    x = np.arange(1, k + 1, dtype=float)
    mu = rng.uniform(2.0, 6.0, n)
    lm = (1 + 2 / (1 + np.exp((x[None, :] - mu[:, None]) / 0.5))).astype(np.float32)
    np.savez(path, axis_values=2.0**x, loss_matrix=lm, axis_name=np.array(["T"]),
             sample_id=np.arange(n) // 5, token_pos=np.arange(n) % 5 + 1)  # fmt: skip
    return path


# -- two processes creating one store at the same moment ----------------------------------------

_GATED = textwrap.dedent("""
    import os, sys, time
    import tokdyn.store.store as S
    gate, name = sys.argv[1], sys.argv[2]
    claim = S._claim_store
    def gated(*a, **k):  # both processes reach the claim before either makes it: the race, every time
        open(os.path.join(gate, "ready_" + name), "w").close()
        while len([f for f in os.listdir(gate) if f.startswith("ready_")]) < 2:
            time.sleep(0.001)
        return claim(*a, **k)
    S._claim_store = gated
    from tokdyn.cli import main
    sys.exit(main(["import-npz", sys.argv[3], sys.argv[4], "--run", name]))
""")


def test_two_imports_creating_one_store_at_once_both_land(tmp_path):
    """Both processes pass the "nothing there" check together (forced by a gate at the claim).
    zarr's "w-" let both go on: one got an internal error, and its clean-up deleted the store
    the other then reported made. Now one claims the store, the other waits and adds its run."""
    npz = write_npz(tmp_path / "l.npz")
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _GATED, str(gate), name, str(npz), str(tmp_path / "s.zarr")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
             for name in ("r1", "r2")]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "internal error" not in err
    st = tokdyn.open_store(tmp_path / "s.zarr", mode="r")
    assert st.runs == ["r1", "r2"]
    for r in ("r1", "r2"):
        assert st.run(r).n_committed == 8
    assert st.probe.n_tokens == 40


def test_a_store_that_loses_the_claim_deletes_nothing(tmp_path):
    """create() of a store another process has just claimed: one StoreError, and the other's
    store is left whole."""
    from tokdyn.store.store import StoreCreatedMeanwhileError, TrajectoryStore, _claim_store

    probe = tokdyn.ProbeSet(None, {"sample_id": np.zeros(4, np.int32), "token_pos": np.arange(1, 5, dtype=np.int32)})
    first = TrajectoryStore.create(tmp_path / "s.zarr", probe)
    with pytest.raises(StoreError, match="already exists"):
        TrajectoryStore.create(tmp_path / "s.zarr", probe)
    shutil.rmtree(tmp_path / "t.zarr", ignore_errors=True)
    _claim_store(str(tmp_path / "t.zarr"), None, {"pid": 1, "token": "other"})  # another process's claim, its probe not yet written
    with pytest.raises(StoreError, match="already exists"):
        TrajectoryStore.create(tmp_path / "t.zarr", probe)
    with pytest.raises(StoreCreatedMeanwhileError):  # claimed between the look and the claim
        _create_after_another_claim(tmp_path / "u.zarr", probe)
    other = json.loads((tmp_path / "u.zarr" / "zarr.json").read_text())  # the other's claim stands
    assert other["attributes"][CREATING]["token"] == "the other process"
    assert (tmp_path / "t.zarr" / "zarr.json").is_file()
    assert tokdyn.open_store(first.url, mode="r").probe.n_tokens == 4


def _create_after_another_claim(url, probe):
    """TrajectoryStore.create at ``url`` with another process's claim written between its look
    for a store there and its own claim."""
    import zarr
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.group import GroupMetadata

    from tokdyn.store import store as S

    real = zarr.storage.StorePath.set_if_not_exists
    doc = GroupMetadata(attributes={CREATING: {"pid": 1, "token": "the other process"}}).to_buffer_dict(
        default_buffer_prototype())["zarr.json"]  # fmt: skip

    async def late(self, value):
        await real(self, doc)
        return await real(self, value)

    zarr.storage.StorePath.set_if_not_exists = late
    try:
        S.TrajectoryStore.create(url, probe)
    finally:
        zarr.storage.StorePath.set_if_not_exists = real


# -- a new store inside another ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["runs/a/fit/mine.zarr", "runs/inner.zarr", "probe/x.zarr"])
def test_a_new_store_inside_a_store_is_refused_before_any_work(tmp_path, capsys, where):
    """tokdyn import-npz into a store's folders made a store there: a refit of the outer run
    deleted it, and the outer store read it as a damaged run."""
    npz = write_npz(tmp_path / "l.npz")
    assert main(["import-npz", str(npz), str(tmp_path / "outer.zarr"), "--run", "a"]) == 0
    capsys.readouterr()
    assert main(["import-npz", str(npz), str(tmp_path / "outer.zarr" / where), "--run", "b"]) == 1
    err = capsys.readouterr().err
    assert "inside the zarr store" in err and err.count("\n") == 1
    assert not (tmp_path / "outer.zarr" / where).exists()
    assert tokdyn.open_store(tmp_path / "outer.zarr", mode="r").runs == ["a"]
    probe = tokdyn.open_store(tmp_path / "outer.zarr", mode="r").probe
    with pytest.raises(InputError, match="inside the zarr store"):  # the library too
        tokdyn.open_store(tmp_path / "outer.zarr" / where, probe, mode="a")


@pytest.mark.parametrize("target, said", [("typo/deep/x.zarr", "does not exist"), ("-", "standard output")])
def test_import_npz_checks_where_a_new_store_goes(tmp_path, capsys, monkeypatch, target, said):
    npz = write_npz(tmp_path / "l.npz")
    monkeypatch.chdir(tmp_path)
    assert main(["import-npz", str(npz), target]) == 1
    assert said in capsys.readouterr().err
    assert not (tmp_path / "typo").exists() and not (tmp_path / "-").exists()


# -- records damaged but still JSON --------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("fitted")
    npz = write_npz(d / "l.npz")
    assert main(["import-npz", str(npz), str(d / "s.zarr"), "--run", "a"]) == 0
    fit_run(tokdyn.open_store(d / "s.zarr", mode="r+").run("a"), progress=False, scheduler="sync")
    return d / "s.zarr"


EDITS = {
    "no probe fingerprint": ("zarr.json", lambda a: a["tokdyn"].pop("probe_fingerprint"), ["info"]),
    "probe fingerprint a number": ("zarr.json", lambda a: a["tokdyn"].update(probe_fingerprint=7), ["info"]),
    "domains null": ("probe/zarr.json", lambda a: a.update(domains=None), ["info"]),
    "documents a number": ("probe/zarr.json", lambda a: a.update(documents=3), ["info"]),
    "fit options null": ("runs/a/fit/zarr.json", lambda a: a["tokdyn_fit"].update(options=None), ["spectrum"]),
    "fit options a list": ("runs/a/fit/zarr.json", lambda a: a["tokdyn_fit"].update(options=[1, 2]), ["reconstruct"]),
    "fit fields a number": ("runs/a/fit/zarr.json", lambda a: a["tokdyn_fit"].update(fields=-1), ["reconstruct"]),
    "fit axis_min past float": ("runs/a/fit/zarr.json", lambda a: a["tokdyn_fit"].update(axis_min=10**400), ["spectrum"]),
    "npz layout dims of bools": ("runs/a/zarr.json",
                                 lambda a: a["tokdyn_run"]["npz_layout"].update(axis_name=["<U1", [True]]), ["export-npz"]),
}  # fmt: skip


@pytest.mark.parametrize("edit", EDITS)
def test_a_damaged_record_that_is_still_json_is_one_line_never_a_bug(fitted, tmp_path, capsys, edit):
    key, change, argv = EDITS[edit]
    store = tmp_path / "m.zarr"
    shutil.copytree(fitted, store)
    doc = json.loads((store / key).read_text())
    change(doc["attributes"])
    (store / key).write_text(json.dumps(doc))
    extra = [str(tmp_path / "o.npz")] if argv == ["export-npz"] else []
    code = main([*argv, str(store), *extra])
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err
    assert code in (0, 1) and err.count("\n") <= 1
    if code:
        assert "damaged" in err or "metadata" in err


def test_a_damaged_fit_record_is_refitted_by_the_command_it_names(fitted, tmp_path, capsys):
    store = tmp_path / "m.zarr"
    shutil.copytree(fitted, store)
    doc = json.loads((store / "runs/a/fit/zarr.json").read_text())
    doc["attributes"]["tokdyn_fit"]["options"] = None
    (store / "runs/a/fit/zarr.json").write_text(json.dumps(doc))
    assert main(["spectrum", str(store)]) == 1
    assert "--refit" in capsys.readouterr().err
    assert main(["fit", str(store), "--run", "a", "--refit"]) == 0
    assert main(["spectrum", str(store)]) == 0


# -- standard output that cannot be written after the work ---------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_an_import_whose_summary_cannot_be_printed_says_so_and_keeps_the_run(tmp_path):
    npz = write_npz(tmp_path / "l.npz")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "tokdyn", "import-npz", str(npz), str(tmp_path / "s.zarr")], stdout=full,
                           stderr=subprocess.PIPE, text=True, env=env, timeout=240)  # fmt: skip
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "cannot write to standard output" in p.stderr and "kept" in p.stderr
    assert tokdyn.open_store(tmp_path / "s.zarr", mode="r").runs == ["l"]


# -- names, sizes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [200, 250, 255])
def test_an_output_file_of_a_long_legal_name_is_written(fitted, tmp_path, capsys, length):
    name = "a" * (length - 4) + ".npz"
    assert main(["export-npz", str(fitted), str(tmp_path / name)]) == 0
    assert (tmp_path / name).is_file() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_export_to_a_name_that_is_only_the_suffix_says_what_is_missing(fitted, tmp_path, capsys):
    assert main(["export-npz", str(fitted), str(tmp_path / ".npz")]) == 1
    assert "a name before .npz" in capsys.readouterr().err


def test_a_store_with_a_folder_that_cannot_be_listed_has_no_size_not_a_smaller_one(fitted, monkeypatch):
    st = tokdyn.open_store(fitted, mode="r")
    whole = st.size_bytes()
    assert whole == sum(p.stat().st_size for p in Path(fitted).rglob("*") if p.is_file())
    scandir = os.scandir

    def refuse(path="."):
        if os.fspath(path).endswith(os.path.join("runs", "a", "fit")):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse)
    assert st.size_bytes() is None


def test_two_threads_creating_one_store_both_get_it(tmp_path, monkeypatch):
    """A creation marker of this very process was read as abandoned (its pid is alive: this
    one), so a second thread replaced the store the first was writing, which the first then
    reported made. The second thread now waits for it."""
    import threading
    import time

    from tokdyn.store import store as S

    real = S.write_probe

    def slow(group, probe):  # the first thread is still writing its probe when the second arrives
        time.sleep(1.0)
        return real(group, probe)

    monkeypatch.setattr(S, "write_probe", slow)
    probe = tokdyn.ProbeSet(None, {"sample_id": np.zeros(4, np.int32), "token_pos": np.arange(1, 5, dtype=np.int32)})
    got = {}

    def make(name):
        try:
            got[name] = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a")
        except Exception as exc:  # noqa: BLE001 - the test reports it
            got[name] = exc

    first = threading.Thread(target=make, args=("a",))
    first.start()
    time.sleep(0.3)
    second = threading.Thread(target=make, args=("b",))
    second.start()
    first.join()
    second.join()
    assert all(isinstance(v, tokdyn.TrajectoryStore) for v in got.values()), got
    assert tokdyn.open_store(tmp_path / "s.zarr", mode="r").probe.n_tokens == 4


def test_a_zarr_group_of_another_tool_is_refused_at_once_not_waited_for(tmp_path):
    import time

    import zarr

    zarr.open_group(str(tmp_path / "other.zarr"), mode="w", zarr_format=2)  # a v2 group: .zgroup, no zarr.json
    probe = tokdyn.ProbeSet(None, {"sample_id": np.zeros(4, np.int32), "token_pos": np.arange(1, 5, dtype=np.int32)})
    t = time.monotonic()
    with pytest.raises(StoreError):
        tokdyn.open_store(tmp_path / "other.zarr", probe, mode="a")
    assert time.monotonic() - t < 10  # not the 30 s wait for a creation in progress
    assert not (tmp_path / "other.zarr" / "zarr.json").exists()


def test_a_file_gone_while_the_size_is_summed_is_no_failure(fitted, monkeypatch):
    """zarr writes a file under a temporary name, then renames it; a refit swaps folders: a file
    listed then gone is not a folder that cannot be read ("size on disk unknown")."""
    st = tokdyn.open_store(fitted, mode="r")
    lstat = os.lstat
    gone = []

    def vanishing(path, *a, **k):
        if not gone and os.fspath(path).endswith("zarr.json"):
            gone.append(path)
            raise FileNotFoundError(2, "No such file or directory", os.fspath(path))
        return lstat(path, *a, **k)

    monkeypatch.setattr(os, "lstat", vanishing)
    assert st.size_bytes() is not None and gone


def test_import_npz_reads_a_new_store_under_home_as_the_library_does(tmp_path, capsys, monkeypatch):
    npz = write_npz(tmp_path / "l.npz")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["import-npz", str(npz), "~/new.zarr"]) == 0
    assert tokdyn.open_store(tmp_path / "new.zarr", mode="r").runs == ["l"]


def test_a_token_read_twice_from_a_run_without_checksums_counts_its_nan_once(tmp_path):
    """losses_at of a run made before position checksums, a NaN token asked for twice: its one
    recorded NaN was counted twice and read as lost chunk data (found by hypothesis in CI)."""
    import warnings

    import zarr

    s = tokdyn.open_store(tmp_path / "s.zarr", tokdyn.ProbeSet.from_tokens(np.zeros((4, 6), int)), mode="a")
    full = np.arange(60, dtype=np.float32).reshape(3, 20)
    full[1, 7] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with s.create_run("legacy", token_chunk=5).writer() as w:
            for j in range(3):
                w.append(full[j], step=j + 1)
    g = zarr.open_group(str(tmp_path / "s.zarr" / "runs" / "legacy"), mode="r+")
    meta = dict(g.attrs["tokdyn_run"])
    meta.pop("integrity")
    g.update_attributes({"tokdyn_run": meta})
    run = tokdyn.open_store(tmp_path / "s.zarr", mode="r").run("legacy")
    for rows, tokens in (([1], [7, 7]), ([1, 1, 0], [7, 3, 7, 19]), ([2, 1], [7])):
        np.testing.assert_array_equal(run.losses_at(rows, tokens), full[np.ix_(rows, tokens)])
