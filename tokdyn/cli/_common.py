"""What several commands share: the store argument (a store, or a folder holding one, as the
demo writes), the run argument (optional where the store holds one run) and ``--json`` output."""

from __future__ import annotations

import json
import os

from .._files import DEMO_STORE, strict_json
from ..errors import InputError
from ..store import Run, TrajectoryStore, as_store

__all__ = ["store_path", "open_cli_store", "open_cli_run", "add_store_argument", "add_run_argument", "print_json", "Given", "number", "shown",
           "at_least", "check_paths", "PATH_ARGUMENTS"]


def add_store_argument(p) -> None:
    p.add_argument("store", help="the store: a path or an fsspec URL (a folder written by `tokdyn demo` also works)")


def add_run_argument(p, *, what: str = "the run", required: bool = False) -> None:
    p.add_argument("--run", required=required, metavar="NAME",
                   help=f"{what}" + ("" if required else " (default: the store's only run)"))  # fmt: skip


def store_path(path: str) -> str:
    """``path``, or the store inside it when it is a folder that is not a store but holds one
    (the output folder of `tokdyn demo`)."""
    if "://" not in path and os.path.isdir(path) and not os.path.exists(os.path.join(path, "zarr.json")):
        inner = os.path.join(path, DEMO_STORE)
        if os.path.exists(os.path.join(inner, "zarr.json")):
            return inner
    return path


def open_cli_store(path: str, *, mode: str = "r") -> TrajectoryStore:
    return as_store(store_path(path), mode=mode)


def open_cli_run(path: str, name: str | None, *, mode: str = "r") -> Run:
    """Run ``name`` of the store at ``path``; without a name, the store's only run."""
    st = open_cli_store(path, mode=mode)
    if name is None:
        runs = st.runs
        if not runs:  # a probe alone, as `tokdyn probe` leaves it
            raise InputError(f"{st.url} has no runs yet; record one into it first with `tokdyn record-offline`, "
                             "a TokenLossRecorder in training, or `tokdyn import-npz`")  # fmt: skip
        if len(runs) != 1:
            raise InputError(f"{st.url} holds {len(runs)} runs ({', '.join(runs)}); choose one with --run NAME")
        name = runs[0]
    return st.run(name)


# The arguments, by dest, that name a file, a folder or a store, in every command.
PATH_ARGUMENTS = frozenset({"store", "input", "output", "table", "source", "out", "tokenizer", "checkpoints", "probe",
                            "held_out"})  # fmt: skip


def check_paths(actions, args) -> None:
    """Refuse an empty path (``--out ""``, an unset ``"$VAR"``) in one line naming its argument,
    before any work: the library read ``""`` as ``.``, and the commands said "output must end in
    .npz, got .", "npz file not found: .", "report path . is a folder", or, for ``--tokenizer ""``,
    nothing at all (the report went on without one). A relative path where the current folder
    was deleted is refused as that (:func:`_relative_to_a_deleted_folder`)."""
    for a in actions:
        if a.dest not in PATH_ARGUMENTS:
            continue
        value = getattr(args, a.dest, None)
        name = "/".join(a.option_strings) or (a.metavar if isinstance(a.metavar, str) else a.dest)
        if value == "":
            raise InputError(f"{name} is an empty path; give the name of a file, folder or store")
        for path in value if isinstance(value, list) else [value]:
            if _relative_to_a_deleted_folder(path):
                raise InputError(f"{name} {path!r} is relative to the current folder, which no longer exists (deleted "
                                 "after the shell entered it); cd to a folder that exists, or give the path from /")


def _relative_to_a_deleted_folder(path) -> bool:
    """Whether ``path`` is a relative local path while the current folder is gone: it read as
    "no tokdyn store at s.zarr" (the store is there, under the folder's new name or restored),
    and a report's default --out as "[Errno 2] No such file or directory", naming nothing."""
    if not isinstance(path, str) or "://" in path or os.path.isabs(os.path.expanduser(path)):
        return False
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


class Given(float):
    """A number option's value that keeps the text the user typed, to echo it in an error."""

    text: str


def number(text: str) -> float:
    """``type=`` of the number options: a float that remembers its text (ValueError: argparse's
    usage error, as ``type=float`` gives)."""
    v = Given(text)
    v.text = text
    return v


number.__name__ = "float"  # argparse names the type in its error: "invalid float value: 'x'"


def shown(v) -> str:
    """A number as the user typed it (``1e308``, ``-1``, ``inf``), or as Python writes it."""
    return getattr(v, "text", None) or str(v)


def at_least(option: str, value, lo: int) -> None:
    """Refuse a count option below ``lo`` in one line naming the option as typed (``--workers``),
    before any work; ``None`` (not given) passes. The library checks again, but in its own
    words (``workers must be None or an int >= 1``), naming a parameter the user never typed."""
    if value is not None and value < lo:
        raise InputError(f"{option} must be an integer >= {lo}, got {value}")


def print_json(obj) -> None:
    """Print ``obj`` as strict JSON (``--json``): NaN and infinities become null."""
    print(json.dumps(strict_json(obj), indent=2, allow_nan=False))
