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

PACKAGE = Path(tokdyn.__file__).resolve().parent
OTHER = f"{__version__}+000000000000"  # this version, other code


def _build_of(root: Path) -> str:
    """``build()`` as a fresh Python importing the tokdyn under ``root`` says it."""
    out = subprocess.run([sys.executable, "-c", "import tokdyn._version as v; print(v.build())"], cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip()


def test_the_code_id_follows_the_sources_not_where_or_how_they_lie(tmp_path):
    """A copy of the package elsewhere has this code's id; its files with Windows line ends
    too; a comment added to one module, a module added, or one renamed, gives another id of
    the same version."""
    assert re.fullmatch(rf"{re.escape(__version__)}\+[0-9a-f]{{12}}", build()) and build().endswith(code_id())
    copy = tmp_path / "a"
    shutil.copytree(PACKAGE, copy / "tokdyn", ignore=shutil.ignore_patterns("__pycache__"))
    assert _build_of(copy) == build()
    sources = sorted((copy / "tokdyn").rglob("*.py"))
    for path in sources:
        path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    assert _build_of(copy) == build()

    seen = {build()}
    lm = copy / "tokdyn" / "fit" / "lm.py"
    for change in (lambda: lm.write_bytes(lm.read_bytes() + b"# a comment\r\n"),
                   lambda: (copy / "tokdyn" / "fit" / "extra.py").write_text("X = 1\n"),
                   lambda: (copy / "tokdyn" / "fit" / "extra.py").rename(copy / "tokdyn" / "fit" / "extra2.py")):  # fmt: skip
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


def _other_code_left_it(run, *, complete: bool) -> None:
    """The fit's record as other code of this version left it; its first block not done unless
    ``complete``."""
    g = run.fit._group()
    g.update_attributes({"tokdyn_fit": {**g.attrs["tokdyn_fit"], "tokdyn_code": "000000000000", "complete": complete}})
    if not complete:
        g["done"][0] = 0


def test_a_fit_records_its_code_and_one_resumed_by_other_code_says_so(tmp_path, capsys):
    """The fit's record names the code that made it. A fit begun by other code and resumed by
    this one warns (its blocks then come from both; the record keeps the creator's), a complete
    one read or refit does not, nor a resume by the same code; the results are the whole fit."""
    Y = planted(400)[0]
    st = make_store(tmp_path / "s.zarr", Y, token_chunk=100)
    fit_run(st.run("r"), scheduler="sync", progress=False)
    assert st.run("r").fit.meta["tokdyn_code"] == code_id()

    _other_code_left_it(st.run("r"), complete=False)
    with pytest.warns(RuntimeWarning, match=r"the fit of run 'r' was made by other code \(tokdyn "
                                            rf"{re.escape(OTHER)}, this is {re.escape(build())}\)"):  # fmt: skip
        res = fit_run(st.run("r"), scheduler="sync", progress=False)
    assert res.blocks_fitted == 1 and st.run("r").fit.complete
    assert st.run("r").fit.meta["tokdyn_code"] == "000000000000"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fit_run(st.run("r"), scheduler="sync", progress=False).blocks_fitted == 0  # complete: nothing fitted
        st.run("r").fit._group()["done"][0] = 0
        g = st.run("r").fit._group()
        g.update_attributes({"tokdyn_fit": {**g.attrs["tokdyn_fit"], "tokdyn_code": code_id(), "complete": False}})
        assert fit_run(st.run("r"), scheduler="sync", progress=False).blocks_fitted == 1  # the same code
        _other_code_left_it(st.run("r"), complete=True)
        assert fit_run(st.run("r"), scheduler="sync", progress=False, refit=True).blocks_fitted == 4
    assert st.run("r").fit.meta["tokdyn_code"] == code_id()

    _other_code_left_it(st.run("r"), complete=False)  # the command says it as one line before its answer
    assert main(["fit", str(tmp_path / "s.zarr"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"tokdyn fit: warning: the fit of run 'r' was made by other code (tokdyn {OTHER}, this is {build()})" in err
