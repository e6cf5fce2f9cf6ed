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

import pytest

import tokdyn
from test_store_fit import make_store, planted
from tokdyn._version import __version__, build, code_id
from tokdyn.cli import main
from tokdyn.errors import InputError
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


def test_version_prints_the_version_and_the_code(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"tokdyn {build()}"


def test_the_cluster_s_question_answers_version_and_code_and_an_older_tokdyn_its_version(monkeypatch):
    """What the cluster's processes are asked (evaluated here as they evaluate it): this
    process's build; a tokdyn from before the code's id answers with its version alone, which
    the check then finds different."""
    assert eval(fitjob._IMPORT_TOKDYN) == build()
    monkeypatch.delattr(fitjob, "tokdyn_build")
    assert eval(fitjob._IMPORT_TOKDYN) == __version__ != build()


def test_a_worker_with_the_same_version_and_other_code_fits_no_block(tmp_path):
    """A block task sent by a fit whose code differs from the worker's, at one version number,
    is refused before the store is opened (the url names nothing)."""
    with pytest.raises(InputError, match=rf"^a worker of the dask cluster runs tokdyn {re.escape(build())}, the fit "
                                         rf"{re.escape(OTHER)}: install the same tokdyn where the cluster runs"):  # fmt: skip
        fitjob._fit_one_block(0, url=str(tmp_path / "nothing.zarr"), storage_options=None, run="r", rows=None, x=None,
                              options=None, backend="numpy", device=None, block=1, n=1, batch_rows=1, fit_id="f",
                              tokdyn_version=OTHER)  # fmt: skip


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


def test_the_fit_records_the_codes_that_fitted_its_blocks_and_warns_where_they_mix(tmp_path):
    """``fitted_by`` lists the builds that fitted the fit's blocks; a resume or repair that keeps
    blocks fitted by other code (or by a tokdyn that recorded none) warns, naming it; one that
    keeps none starts the list again and says nothing, as does a resume by the same code, a
    complete fit run again and a refit. Here two codes of this version, A and B."""
    st = make_store(tmp_path / "s.zarr", planted(400)[0], token_chunk=100)  # 4 blocks
    assert _fit(st, build())[1] == [] and _fitted_by(st) == [build()]

    _undo(st, 0, 1, 2, 3)  # killed before a block was done: nothing of A's is kept
    res, said = _fit(st, A)
    assert said == [] and res.blocks_fitted == 4 and _fitted_by(st) == [A]
    _undo(st, 2)  # A again, on its own blocks
    assert _fit(st, A)[1] == [] and _fitted_by(st) == [A]

    _undo(st, 1, 3)  # B resumes A's fit: blocks 0 and 2 are A's
    res, said = _fit(st, B)
    assert res.blocks_fitted == 2 and st.run("r").fit.complete and _fitted_by(st) == [A, B]
    assert said == [f"the fit of run 'r' keeps blocks fitted by other code (tokdyn {A}), and this code (tokdyn {B}) "
                    "fits the rest; refit=True (--refit) fits every block with this one"]  # fmt: skip
    assert _fit(st, B)[1] == []  # complete: nothing fitted, nothing said

    g = st.run("r").fit._group()  # block 3's checksum no longer what was written: --repair fits it again
    g["crc"][3, 0] = int(g["crc"][3, 0]) ^ 1
    res, said = _fit(st, B, repair=True)
    assert res.blocks_fitted == 1 and len(said) == 1 and f"(tokdyn {A})" in said[0] and _fitted_by(st) == [A, B]

    res, said = _fit(st, B, refit=True)
    assert said == [] and res.blocks_fitted == 4 and _fitted_by(st) == [B]


@pytest.mark.parametrize("stored, says", [(None, "an earlier tokdyn, which recorded none"),
                                          ("0.1.0+cccccccccccc", "an earlier tokdyn, which recorded none"),  # not a list
                                          (["x" * 5000, None, A, B, "y", "z"], f"tokdyn {'x' * 40}, an earlier tokdyn, "
                                                                               f"which recorded none, tokdyn {A}, tokdyn y and 1 more")],
                         ids=["before the record", "damaged", "long"])  # fmt: skip
def test_a_fit_that_does_not_say_who_fitted_it_warns_when_resumed(stored, says, tmp_path):
    """A fit made before ``fitted_by`` (or whose record of it is damaged) is resumed with a
    warning, since any code may have fitted its kept blocks; a long record is said in a line of
    bounded length, without this code among the others."""
    st = make_store(tmp_path / "s.zarr", planted(400)[0], token_chunk=100)
    _fit(st, B)
    g = st.run("r").fit._group()
    meta = {k: v for k, v in g.attrs["tokdyn_fit"].items() if k != "fitted_by"}
    g.update_attributes({"tokdyn_fit": meta if stored is None else {**meta, "fitted_by": stored}})
    _undo(st, 1)
    res, said = _fit(st, B)
    assert res.blocks_fitted == 1 and len(said) == 1 and f"other code ({says}), and this code (tokdyn {B})" in said[0]
    assert len(said[0]) < 400


def test_the_command_says_the_mix_in_one_line(tmp_path, capsys, monkeypatch):
    st = make_store(tmp_path / "s.zarr", planted(400)[0], token_chunk=100)
    _fit(st, A)
    _undo(st, 0)
    assert main(["fit", str(tmp_path / "s.zarr"), "--no-progress"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert err == [f"tokdyn fit: warning: the fit of run 'r' keeps blocks fitted by other code (tokdyn {A}), and this code "
                   f"(tokdyn {build()}) fits the rest; refit=True (--refit) fits every block with this one"]  # fmt: skip
    assert _fitted_by(st) == [A, build()]
