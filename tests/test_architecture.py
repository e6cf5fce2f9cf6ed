"""The import rules of docs/architecture.md, checked on the source (every import statement,
function-level ones included) and on what importing a stage really loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tokdyn"

# stage (a module or package of tokdyn) -> tokdyn modules it must never import
FORBIDDEN = {
    "errors": {"*"},
    "_version": {"*"},
    "_lazy": {"*"},
    "store": {"fit", "spectrum", "reconstruct", "analysis", "report", "record", "curriculum", "model", "train", "demo", "data", "axes"},
    "fit": {"record", "train", "model", "data", "demo", "curriculum", "spectrum", "reconstruct", "analysis", "report"},
    "record": {"model", "train", "demo", "fit", "spectrum", "reconstruct", "analysis", "report", "curriculum"},
    "spectrum": {"record", "train", "model", "demo", "analysis", "report", "curriculum"},
    "reconstruct": {"record", "train", "model", "demo", "analysis", "report", "curriculum"},
    "axes": {"record", "train", "model", "demo", "fit", "analysis", "report", "curriculum"},
    "tokenstats": {"record", "train", "model", "demo", "fit", "analysis", "report", "curriculum"},
    "analysis": {"record", "train", "model", "demo", "report", "curriculum"},
    "report": {"record", "train", "model", "demo", "curriculum"},
    "interchange": {"record", "train", "model", "demo", "fit", "analysis", "report", "curriculum"},
    "sweep": {"model", "train", "demo", "data", "fit", "spectrum", "reconstruct", "axes", "analysis", "report", "curriculum"},
    "runtime": {"*"},
}


def _stage(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return rel.parts[0]


def _imported(path: Path) -> set[str]:
    """The first component below ``tokdyn`` of every tokdyn module ``path`` imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    depth = len(path.relative_to(PACKAGE).parts) - 1  # folders below tokdyn/
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = list(path.relative_to(PACKAGE).parent.parts)[: max(0, depth - (node.level - 1))]
                mod = ".".join(["tokdyn", *base, *(node.module.split(".") if node.module else [])])
                names = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""]
        else:
            continue
        for n in names:
            parts = n.split(".")
            if parts[0] == "tokdyn" and len(parts) > 1:
                out.add(parts[1])
    return out


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_import_rules(path):
    stage = _stage(path)
    imported = _imported(path) - {stage}
    # the CLI, and `python -m tokdyn` (tokdyn/__main__.py), which is the CLI's second door
    assert "cli" not in imported or stage in ("cli", "__main__"), f"{path.name}: the library never imports the CLI"
    forbidden = FORBIDDEN.get(stage, set())
    bad = imported - {"errors", "_version"} if "*" in forbidden else imported & forbidden
    assert not bad, f"{path.relative_to(PACKAGE)} ({stage}) imports {sorted(bad)}; docs/architecture.md forbids it"


def _loaded_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_importing_the_store_loads_no_torch_and_no_later_stage():
    loaded = _loaded_by("import tokdyn.store")
    assert "torch" not in loaded
    assert not {m for m in loaded if m.split(".")[:2] in (["tokdyn", "fit"], ["tokdyn", "spectrum"], ["tokdyn", "record"])}


def test_the_command_line_starts_without_torch():
    """Every command pays the CLI's start: torch (a second or more) is imported by the commands
    that train or evaluate models, when they run, not by `tokdyn info` or `tokdyn --help`."""
    loaded = _loaded_by("import tokdyn.cli")
    assert "torch" not in loaded and "transformers" not in loaded
    assert "torch" in _loaded_by("import tokdyn.record as r; r.TokenLossRecorder")  # the lazy names still resolve
    import importlib

    for name in ("tokdyn.record", "tokdyn.record.offline"):
        mod = importlib.import_module(name)
        assert all(getattr(mod, n, None) is not None for n in mod.__all__), name  # every listed name loads


def test_importing_fit_loads_no_training_code():
    loaded = _loaded_by("import tokdyn.fit")
    assert not loaded & {"tokdyn.record", "tokdyn.train", "tokdyn.model", "tokdyn.data", "tokdyn.demo", "tokdyn.curriculum"}


def test_fitting_arrays_in_memory_needs_no_store_packages():
    """fit_sigmoids runs where only numpy, torch and numba are (a GPU machine's image): the
    store's fit (tokdyn.fit.job: zarr, dask) loads when one of its names is first used."""
    loaded = _loaded_by("import tokdyn.fit; from tokdyn.fit import fit_sigmoids, FitOptions")
    assert not {m.split(".")[0] for m in loaded} & {"zarr", "dask", "numcodecs", "xarray"}
    assert "tokdyn.fit.job" not in loaded and "tokdyn.store" not in loaded
    assert "zarr" in _loaded_by("import tokdyn.fit as f; f.fit_run")  # the lazy names resolve
    import tokdyn.fit

    assert all(getattr(tokdyn.fit, n, None) is not None for n in tokdyn.fit.__all__)


def test_the_package_exports_resolve():
    import tokdyn

    for name in tokdyn.__all__:
        assert getattr(tokdyn, name) is not None, name
    assert tokdyn.TokenLossRecorder is tokdyn.record.TokenLossRecorder  # the README's example
