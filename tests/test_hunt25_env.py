"""Hunt 25: tokdyn installed and run on machines unlike the developer's (read-only installs, numba's
cache, odd interpreters, locales and streams, hash seeds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tokdyn
from reliability_fixtures import cli_error_line, run_cli
from test_hostile import fitted_store

PACKAGE = Path(tokdyn.__file__).parent


def _copy_package(to: Path) -> Path:
    """A copy of tokdyn's sources (no caches) under ``to``, for a process to import instead."""
    shutil.copytree(PACKAGE, to / "tokdyn", ignore=shutil.ignore_patterns("__pycache__"))
    return to


def _python(code: str, root: Path, env: dict[str, str] | None = None, args: list[str] | None = None):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHON", "TOKDYN_"))}
    full.update(PYTHONPATH=str(root), **(env or {}))
    cmd = [sys.executable, *(["-c", code] if code else []), *(args or [])]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300, cwd=root)


# _sigmoid_columns (numba_kernels.py) clips z at Z_CLIP, a constant of sigmoid.py, another file
_CLIPPED_Z = """
import numpy as np
from tokdyn.fit.numba_kernels import _sigmoid_columns
z, g, h = np.zeros(1), np.zeros(1), np.zeros(1)
_sigmoid_columns(np.array([1e3]), 1, 0.0, 1.0, z, g, h)
print(z[0])
"""


def test_a_kernel_kept_on_disk_is_compiled_again_when_tokdyn_changes_in_another_file(tmp_path):
    """numba keyed its cache by the kernel's own file: after a change to a constant or callee in
    another file (an upgrade over an old __pycache__, a `git pull`) the old machine code ran."""
    root = _copy_package(tmp_path)
    first = _python(_CLIPPED_Z, root)
    assert first.returncode == 0, first.stderr
    assert float(first.stdout) == 50.0  # Z_CLIP as shipped
    assert list((root / "tokdyn" / "fit" / "__pycache__").glob("numba_kernels._sigmoid_columns*.nbi"))  # kept on disk
    sigmoid = root / "tokdyn" / "fit" / "sigmoid.py"
    text = sigmoid.read_text()
    assert "\nZ_CLIP = 50.0\n" in text
    sigmoid.write_text(text.replace("\nZ_CLIP = 50.0\n", "\nZ_CLIP = 40.0\n"))
    again = _python(_CLIPPED_Z, root)
    assert again.returncode == 0, again.stderr
    assert float(again.stdout) == 40.0  # the new code's answer (50.0 before: the old kernel, loaded)
    cached = _python(_CLIPPED_Z, root)  # and the new entry is kept and used
    assert float(cached.stdout) == 40.0


def _no_cache_folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of tokdyn where numba finds no folder to write its cache in, for any user (root
    too): each package folder's __pycache__ is a file, and NUMBA_CACHE_DIR and the user's cache
    folder lie under a file, as in a read-only install whose home cannot be written."""
    root = _copy_package(tmp_path / "install")
    for folder in [p for p in (root / "tokdyn").rglob("*") if p.is_dir()] + [root / "tokdyn"]:
        (folder / "__pycache__").write_bytes(b"")
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    return root, {"NUMBA_CACHE_DIR": str(blocker / "numba"), "XDG_CACHE_HOME": str(blocker / "cache"),
                  "HOME": str(blocker / "home")}


def test_a_read_only_install_runs_every_command_and_says_once_that_kernels_are_not_kept(tmp_path):
    """numba's cache=True raised "cannot cache function ...: no locator available" as tokdyn's
    kernels were imported: a traceback for every command, --help included."""
    root, env = _no_cache_folder(tmp_path)
    helped = _python("", root, env, ["-m", "tokdyn", "--help"])
    assert helped.returncode == 0 and "usage: tokdyn" in helped.stdout, helped.stderr
    assert helped.stderr == ""  # nothing compiled, nothing said
    # the fit's backend says it once (a second fit in the process says nothing), and the kernels run uncached
    code = _CLIPPED_Z + """
import warnings
from tokdyn.fit.backends import resolve_backend
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    resolve_backend("numba")
    resolve_backend("numba")
print(len(said))
print(said[0].message)
"""
    got = _python(code, root, env)
    assert got.returncode == 0, got.stderr
    z, count, message = got.stdout.splitlines()
    assert float(z) == 50.0 and count == "1"
    assert "numba cannot keep tokdyn's compiled kernels on disk" in message and "NUMBA_CACHE_DIR" in message
    assert not any(p.suffix in (".nbi", ".nbc") for p in tmp_path.rglob("*"))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A small store (tests/test_hostile.py's), fitted by numpy (nothing to compile)."""
    path = tmp_path_factory.mktemp("env") / "s.zarr"
    st = fitted_store(path, fit=False)
    tokdyn.fit_run(st.run("r"), backend="numpy", scheduler="sync", progress=False)
    return path


@pytest.mark.parametrize("flag", [["-O"], ["-OO"], []], ids=["-O", "-OO", "PYTHONOPTIMIZE"])
def test_python_optimized_is_said_as_such_not_as_a_damaged_store(flag, store):
    """zarr 3.1 reads a group's metadata inside an assert: under python -O every store was
    "the probe group's metadata is unreadable (TypeError: ...)", as if damaged."""
    env = {} if flag else {"PYTHONOPTIMIZE": "1"}
    for args in (["info", str(store)], ["spectrum", str(store)], ["report", str(store), "--out", str(store.parent / "r.html")]):
        got = _python("", PACKAGE.parent, env, [*flag, "-m", "tokdyn", *args])
        assert got.returncode == 1 and got.stdout == ""
        assert got.stderr.count("\n") == 1 and "python -O" in got.stderr and "damaged" not in got.stderr
        assert got.stderr.startswith(f"tokdyn {args[0]}: error: zarr ") and "unset PYTHONOPTIMIZE" in got.stderr
    assert not (store.parent / "r.html").exists()
    plain = _python("", PACKAGE.parent, {}, ["-m", "tokdyn", "info", str(store)])
    assert plain.returncode == 0, plain.stderr


@pytest.mark.parametrize("category", [RuntimeWarning, DeprecationWarning, UserWarning, FutureWarning])
def test_a_warning_made_an_error_is_said_as_the_warning_not_as_a_bug(category, store, monkeypatch, capsys):
    """Under python -W error or PYTHONWARNINGS=error (a CI's setting), a warning of tokdyn or of a
    dependency was "internal error in tokdyn ...: RuntimeWarning: ... (a bug: please report it)"."""
    import warnings

    import tokdyn.cli.store as cli_store

    opened = cli_store.open_cli_store

    def warns(*a, **k):  # as a dependency's warning, raised where the store is opened
        warnings.warn(f"{category.__name__} from a dependency", category, stacklevel=2)
        return opened(*a, **k)

    monkeypatch.setattr(cli_store, "open_cli_store", warns)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, err = run_cli(["info", str(store)], capsys)
    assert code == 1
    line = cli_error_line(err)
    assert line == (f"tokdyn info: error: {category.__name__} from a dependency "
                    f"({category.__name__}, an error by python's -W or PYTHONWARNINGS)")
    with warnings.catch_warnings():  # the warning as a warning, the command done
        warnings.simplefilter("default")
        code, err = run_cli(["info", str(store)], capsys)
    assert code == 0 and err == f"tokdyn info: warning: {category.__name__} from a dependency\n"


def test_tokdyns_own_warning_made_an_error_is_said_as_the_warning(store, capsys):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, err = run_cli(["fit", str(store), "--scheduler", "sync", "--workers", "4", "--no-progress"], capsys)
    assert code == 1
    assert cli_error_line(err) == ("tokdyn fit: error: workers=4 is ignored: the sync scheduler fits one block at a time "
                                   "in this thread (use threads or processes for more) (RuntimeWarning, an error by "
                                   "python's -W or PYTHONWARNINGS)")


@pytest.mark.parametrize("place", ["MPLCONFIGDIR", "HOME"])
def test_a_matplotlib_settings_folder_that_cannot_be_written_is_one_warning(place, store, tmp_path):
    """matplotlib logged two lines (the second of 300 characters) before the report's own line
    where it could write no settings folder: a read-only home, an MPLCONFIGDIR that is a file."""
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    env = {"MPLCONFIGDIR": str(blocker / "mpl")} if place == "MPLCONFIGDIR" else {"HOME": str(blocker / "home"), "XDG_CONFIG_HOME": str(blocker / "config")}
    out = tmp_path / "r.html"
    got = _python("", PACKAGE.parent, env, ["-m", "tokdyn", "report", str(store), "--out", str(out)])
    assert got.returncode == 0 and got.stdout == f"wrote {out}\n", got.stderr
    assert got.stderr.count("\n") == 1 and got.stderr.startswith("tokdyn report: warning: matplotlib cannot write its settings folder (")
    assert str(blocker) in got.stderr and got.stderr.endswith("; set MPLCONFIGDIR to a writable folder\n")
    assert out.read_text().startswith("<!doctype html>")


@pytest.mark.parametrize("argv, relative", [
    (["info", "s.zarr"], "s.zarr"),
    (["report", "{store}"], "report.html"),  # --out's default
    (["report", "{store}", "--out", "r.html"], "r.html"),
    (["spectrum", "s.zarr"], "s.zarr"),
    (["export-npz", "{store}", "--run", "r", "x.npz"], "x.npz"),
], ids=["info", "report-default-out", "report-out", "spectrum", "export-npz"])
def test_a_relative_path_in_a_deleted_current_folder_is_said_as_such(argv, relative, store, tmp_path, monkeypatch, capsys):
    """A shell still in a folder that was deleted (or renamed): a relative store read as "no
    tokdyn store at s.zarr", a report's default --out as "[Errno 2] No such file or directory"."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    argv = [a.format(store=store) for a in argv]
    code, err = run_cli(argv, capsys)
    assert code == 1
    line = cli_error_line(err)
    assert line.startswith(f"tokdyn {argv[0]}: error: ")
    assert f"'{relative}' is relative to the current folder, which no longer exists" in line
    assert not list(tmp_path.rglob("*.html")) and not list(tmp_path.rglob("*.npz"))
