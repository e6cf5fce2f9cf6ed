"""Which code a process runs: ``tokdyn._version.code_id`` (a digest of the package's sources),
printed by ``tokdyn --version``, compared by a dask cluster's processes before they share a fit,
and recorded with each fit. The version number alone could not tell two checkouts of one
version apart, which fit with other code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tokdyn
from test_store_fit import make_store, planted
from tokdyn._version import __version__, build, code_id
from tokdyn.cli import main
from tokdyn.errors import InputError
from tokdyn.fit import FIT_FIELDS
from tokdyn.fit import job as fitjob
from tokdyn.fit.job import fit_run
from tokdyn.store import fit as storefit

PACKAGE = Path(tokdyn.__file__).resolve().parent
OTHER = f"{__version__}+000000000000"  # this version, other code


def _build_of(root: Path) -> str:
    """``build()`` as a fresh Python importing the tokdyn under ``root`` says it."""
    out = subprocess.run([sys.executable, "-c", "import tokdyn._version as v; print(v.build())"], cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip()


def test_the_code_id_follows_the_sources_not_where_or_how_they_lie(tmp_path):
    """A copy of the package elsewhere has this code's id; its files with Windows line ends
    too, and files beside its modules that Python would not import; a comment added to one
    module, a module added, one renamed, or one that cannot be read, gives another id of the
    same version."""
    assert re.fullmatch(rf"{re.escape(__version__)}\+[0-9a-f]{{12}}", build()) and build().endswith(code_id())
    copy = tmp_path / "a"
    shutil.copytree(PACKAGE, copy / "tokdyn", ignore=shutil.ignore_patterns("__pycache__"))
    assert _build_of(copy) == build()
    sources = sorted((copy / "tokdyn").rglob("*.py"))
    for path in sources:
        path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    assert _build_of(copy) == build()

    (copy / "tokdyn" / ".ipynb_checkpoints").mkdir()  # beside the modules, never imported: not the code
    shutil.copy(copy / "tokdyn" / "fit" / "job.py", copy / "tokdyn" / ".ipynb_checkpoints" / "job-checkpoint.py")
    (copy / "tokdyn" / "fit" / ".#job.py").symlink_to("user@host.1234:1700000000")  # an editor's lock: a dangling link
    (copy / "tokdyn" / os.fsdecode(b"\xe9t\xe9.py")).write_text("X = 1\n")  # a name that is not UTF-8
    assert _build_of(copy) == build()

    seen = {build()}
    lm = copy / "tokdyn" / "fit" / "lm.py"
    for change in (lambda: lm.write_bytes(lm.read_bytes() + b"# a comment\r\n"),
                   lambda: (copy / "tokdyn" / "fit" / "extra.py").write_text("X = 1\n"),
                   lambda: (copy / "tokdyn" / "fit" / "extra.py").rename(copy / "tokdyn" / "fit" / "extra2.py"),
                   lambda: (copy / "tokdyn" / "fit" / "unreadable.py").mkdir()):  # fmt: skip
        change()
        got = _build_of(copy)
        assert got.startswith(f"{__version__}+") and got not in seen, got
        seen.add(got)


def test_a_package_that_cannot_be_listed_is_unknown_code_not_a_traceback(monkeypatch):
    """Where the package's folder cannot be listed (a zip import, a disk error) the id is None
    and the build ``0.1.0+unknown``: never the bare version an older tokdyn answers."""
    import tokdyn._version as v

    def unlistable(self, pattern):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(Path, "rglob", unlistable)
    assert v._code_id() is None
    monkeypatch.setattr(v, "_CODE_ID", None)
    assert v.build() == f"{__version__}+unknown"


def test_version_prints_the_version_and_the_code(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"tokdyn {build()}"


def test_the_cluster_s_question_answers_version_and_code_and_an_older_tokdyn_its_version(monkeypatch):
    """What the cluster's processes are asked (evaluated here as they evaluate it): this
    process's build; a tokdyn from before the code's id answers with its version alone, which
    the check then finds different."""
    assert eval(fitjob._IMPORT_TOKDYN) == build()
    monkeypatch.delattr(tokdyn._version, "build")
    assert eval(fitjob._IMPORT_TOKDYN) == __version__ != build()


def test_a_worker_with_the_same_version_and_other_code_fits_no_block(tmp_path):
    """A block task sent by a fit whose code differs from the worker's, at one version number,
    is refused before the store is opened (the url names nothing); out of a dask worker, it is
    a worker process of this machine that imported tokdyn's files after an edit."""
    with pytest.raises(InputError, match=rf"^a worker process of the fit imported tokdyn {re.escape(build())}, the fit's "
                                         rf"process {re.escape(OTHER)}: tokdyn's files changed after"):  # fmt: skip
        fitjob._fit_one_block(0, url=str(tmp_path / "nothing.zarr"), storage_options=None, run="r", rows=None, x=None,
                              options=None, backend="numpy", device=None, block=1, n=1, batch_rows=1, fit_id="f",
                              tokdyn_version=OTHER)  # fmt: skip


def test_a_worker_process_that_imported_other_files_fits_no_block(tmp_path, monkeypatch):
    """`processes` starts new Pythons, which import tokdyn's files as they are then: where they
    changed after the fit's process imported them (here its build is patched to say so), the
    workers refuse their blocks in one line instead of marking them as code not known."""
    st = make_store(tmp_path / "s.zarr", planted(200)[0], token_chunk=100)
    monkeypatch.setattr(fitjob, "tokdyn_build", lambda: OTHER)
    with pytest.raises(InputError, match=rf"^a worker process of the fit imported tokdyn {re.escape(build())}, the fit's "
                                         rf"process {re.escape(OTHER)}"):  # fmt: skip
        fit_run(st.run("r"), scheduler="processes", workers=1, progress=False)
    assert not np.asarray(st.run("r").fit._group()["done"][...]).any()


@pytest.mark.skipif(not __import__("importlib").util.find_spec("distributed"), reason="dask.distributed is not installed")
def test_a_scheduler_of_this_version_with_other_code_is_accepted(tmp_path, monkeypatch):
    """The scheduler fits nothing (it unpickles the tasks): this version is enough there, so a
    long-running scheduler need not be restarted for a change to the code; another version is
    refused."""
    import distributed

    st = make_store(tmp_path / "s.zarr", planted(200)[0], token_chunk=100)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        monkeypatch.setattr(fitjob, "_tokdyn_on_scheduler", lambda client: OTHER)
        assert fit_run(st.run("r"), scheduler=cluster.scheduler_address, progress=False).blocks_fitted == 2
        monkeypatch.setattr(fitjob, "_tokdyn_on_scheduler", lambda client: "0.0.1+" + code_id())
        with pytest.raises(InputError, match=r"^the scheduler of the dask cluster at .* runs tokdyn 0\.0\.1\+"):
            fit_run(st.run("r"), scheduler=cluster.scheduler_address, progress=False, refit=True)


A, B = f"{__version__}+aaaaaaaaaaaa", f"{__version__}+bbbbbbbbbbbb"  # two codes of this version


def _fit(st, code: str, **kw):
    """``fit_run`` of run "r" as the tokdyn whose build is ``code`` does it, with every warning
    it gives: ``(summary, [warning messages])``."""
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        mp.setattr(storefit, "build", lambda: code)
        res = fit_run(st.run("r"), scheduler="sync", progress=False, **kw)
    said = [w for w in got if issubclass(w.category, RuntimeWarning) and "other code" in str(w.message)]
    assert all(w.filename == __file__ for w in said), [w.filename for w in said]  # the caller's line, not tokdyn's
    return res, [str(w.message) for w in said]


def _undo(st, *blocks: int) -> None:
    """Blocks ``blocks`` of the fit not done, the fit unfinished: as a kill leaves it."""
    g = st.run("r").fit._group()
    for b in blocks:
        g["done"][b] = 0
    g.update_attributes({"tokdyn_fit": {**g.attrs["tokdyn_fit"], "complete": False}})


def _fitted_by(st):
    return st.run("r").fit.meta.get("fitted_by")


def _flags(st) -> list[int]:
    return np.asarray(st.run("r").fit._group()["done"][...]).tolist()


def test_each_block_names_the_code_that_fitted_it_and_a_mix_is_said(tmp_path):
    """A block's done flag names its code in ``fitted_by``; a resume or repair that keeps a
    block of other code (A's, B fitting) warns, naming that code; the same code, a resume that
    keeps none of another's blocks, a complete fit run again and a refit say nothing. Two codes
    of this version, A and B."""
    st = make_store(tmp_path / "s.zarr", planted(400)[0], token_chunk=100)  # 4 blocks
    assert _fit(st, build())[1] == [] and _fitted_by(st) == [build()] and _flags(st) == [2] * 4

    _undo(st, 0, 1, 2, 3)  # killed before a block was done: nothing of the first code's is kept
    res, said = _fit(st, A)
    assert said == [] and res.blocks_fitted == 4 and _fitted_by(st) == [build(), A] and _flags(st) == [3] * 4
    _undo(st, 2)  # A again, on its own blocks
    assert _fit(st, A)[1] == []

    _undo(st, 1, 3)  # B resumes A's fit: blocks 0 and 2 are A's
    res, said = _fit(st, B)
    assert res.blocks_fitted == 2 and st.run("r").fit.complete and _fitted_by(st) == [build(), A, B]
    assert _flags(st) == [3, 4, 3, 4]
    assert said == [f"the fit of run 'r' keeps blocks fitted by other code (tokdyn {A}), and this code (tokdyn {B}) "
                    "fits the rest; refit=True (--refit) fits every block with this one"]  # fmt: skip
    assert _fit(st, B)[1] == []  # complete: nothing fitted, nothing said

    g = st.run("r").fit._group()  # block 3's checksum no longer what was written: --repair fits it again
    g["crc"][3, 0] = int(g["crc"][3, 0]) ^ 1
    res, said = _fit(st, B, repair=True)
    assert res.blocks_fitted == 1 and len(said) == 1 and f"(tokdyn {A})" in said[0]
    _undo(st, 0, 2)  # A's blocks fitted again by B: B's alone are kept
    assert _fit(st, B)[1] == [] and _flags(st) == [4] * 4

    res, said = _fit(st, B, refit=True)
    assert said == [] and res.blocks_fitted == 4 and _fitted_by(st) == [B] and _flags(st) == [2] * 4


def test_a_code_that_fitted_nothing_is_not_blamed_and_a_late_block_is(tmp_path, monkeypatch):
    """B stopped before it fitted a block (Ctrl-C at the warning) leaves no block of its own:
    A resuming then says nothing. A block of A's that lands after B took over (a cluster task
    still running when A's fit stopped) carries A's flag, so B's next resume names A."""
    st = make_store(tmp_path / "s.zarr", planted(400)[0], token_chunk=100)
    _fit(st, A)
    _undo(st, 2, 3)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as mp:
        mp.setattr(fitjob, "_run_tasks", stopped)
        with pytest.raises(KeyboardInterrupt):
            _fit(st, B)
    assert _fitted_by(st) == [A, B]
    res, said = _fit(st, A)
    assert said == [] and res.blocks_fitted == 2

    _undo(st, 0, 1, 2, 3)  # A's job stopped with its blocks in flight; B fits them all
    assert _fit(st, B)[1] == [] and _flags(st) == [3] * 4
    fit = st.run("r").fit
    late = fit.read(fields=tuple(fit.meta["fields"]), current=False)
    monkeypatch.setattr(storefit, "build", lambda: A)  # A's task, late
    fit.write_block(3, 300, {k: v[300:] for k, v in late.items()}, fit_id=fit.meta["fit_id"])
    monkeypatch.undo()
    _undo(st, 0)
    res, said = _fit(st, B)
    assert res.blocks_fitted == 1 and len(said) == 1 and f"(tokdyn {A})" in said[0]


@pytest.mark.parametrize("stored, flags, says", [
    (None, [2, 2, 2], "code not recorded"),  # a fit from before the record
    ("0.1.0+cccccccccccc", [2, 3, 2], "code not recorded"),  # damaged: not a list
    ([A, B], [1, 1, 1], "code not recorded"),  # written by a writer that did not say
    (["x" * 5000, None, A, B, "y", "z"], [2, 3, 4, 5, 6, 7, 200],  # long, and a flag beyond it (not recorded, said once)
     f"tokdyn {'x' * 40}, code not recorded, tokdyn {A}, tokdyn y and 1 more"),
], ids=["before the record", "damaged", "unsaid", "long"])  # fmt: skip
def test_blocks_whose_code_is_not_known_are_said_as_such(stored, flags, says, tmp_path):
    """Kept blocks whose code the record cannot tell are code not recorded (a resume warns);
    a long record is said in a line of bounded length, without this code among the others."""
    n = len(flags) + 1
    st = make_store(tmp_path / "s.zarr", planted(100 * n)[0], token_chunk=100)
    _fit(st, B)
    g = st.run("r").fit._group()
    meta = {k: v for k, v in g.attrs["tokdyn_fit"].items() if k != "fitted_by"}
    g.update_attributes({"tokdyn_fit": meta if stored is None else {**meta, "fitted_by": stored}})
    g["done"][: n - 1] = flags
    _undo(st, n - 1)
    res, said = _fit(st, B)
    assert res.blocks_fitted == 1 and len(said) == 1 and f"other code ({says}), and this code (tokdyn {B})" in said[0]
    assert len(said[0]) < 400


def test_a_writer_of_its_own_marks_its_blocks_with_its_code(tmp_path):
    """A program that writes a fit's blocks itself (`run.fit.writer`, `write_block`) marks them
    with its code, so its own resume says nothing; a block handed over by a process of other
    code, whose code the list does not hold, is code not known."""
    st = make_store(tmp_path / "s.zarr", planted(100)[0], token_chunk=50)
    run = st.run("r")
    fields = {name: np.dtype(dt).str for name, dt in FIT_FIELDS.items()}
    block = {name: np.ones(50, dtype=dt) for name, dt in FIT_FIELDS.items()}
    inputs = {"n_committed": run.n_committed, "block_tokens": 50}
    with warnings.catch_warnings(record=True) as got, pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("always")
        with run.fit.writer(inputs, fields, n_blocks=2) as w:
            assert w.todo() == ([0, 1], [])
            run.fit.write_block(0, 0, block, fit_id=w.fit_id)
        assert _flags(st) == [2, 0]
        with run.fit.writer(inputs, fields, n_blocks=2) as w:
            assert w.todo() == ([1], [])
            mp.setattr(storefit, "build", lambda: A)
            run.fit.write_block(1, 50, block, fit_id=w.fit_id)
    assert _flags(st) == [2, 1] and not [w for w in got if "other code" in str(w.message)]


def test_the_command_says_the_mix_in_one_line(tmp_path, capsys, monkeypatch):
    st = make_store(tmp_path / "s.zarr", planted(400)[0], token_chunk=100)
    _fit(st, A)
    _undo(st, 0)
    assert main(["fit", str(tmp_path / "s.zarr"), "--no-progress"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert err == [f"tokdyn fit: warning: the fit of run 'r' keeps blocks fitted by other code (tokdyn {A}), and this code "
                   f"(tokdyn {build()}) fits the rest; refit=True (--refit) fits every block with this one"]  # fmt: skip
    assert _fitted_by(st) == [A, build()]
