"""The trajectory store: one zarr v3 hierarchy holding one probe set and any number of runs.

Layout (``docs/store.md`` is the full schema)::

    /                      attrs["tokdyn"]: kind, schema_version, probe_fingerprint, versions
    /probe                 attrs: fingerprint, domains, documents, tokenizer, context
    /probe/tokens          int32 [sequence, position]       (absent for an imported probe)
    /probe/<field>         [token]: sample_id, token_pos, token_id, doc_id, doc_pos, domain, ...
    /runs/<name>           attrs["tokdyn_run"]: axis, model config, parameter counts, writers, ...
    /runs/<name>/loss      float32|float16|float64 [checkpoint, token], chunks (1, token_chunk)
    /runs/<name>/step, axis_value, tokens_seen, lr, wall_time, ckpt_fingerprint   [checkpoint]
    /runs/<name>/commits/w<j>   attrs: rows, last_step, nonfinite   (one per writer)
    /runs/<name>/fit       the fit results (``tokdyn/store/fit.py``)

Crash safety rests on three rules. (1) Every loss chunk holds one checkpoint row, so appending
a row writes new chunk objects and never rewrites a committed one. (2) A row becomes visible
only when its writer's commit record (a zarr.json, which zarr writes atomically: temp file and
rename locally, one PUT on object stores) is updated *after* the data. (3) A run's committed
row count is the minimum over its writers, so a row counts only once every token range of it
is written. Arrays may be longer than the committed count (capacity allocated ahead, or a row
in flight when a process died); readers slice to the committed rows, and a resumed writer
overwrites the uncommitted tail.
"""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.group import GroupMetadata
from zarr.core.sync import sync as zarr_sync
from zarr.storage import LocalStore, StorePath

from .._checks import check_count
from .._text import command_line
from .._files import kind_of_mode, link_note, not_a_folder, refuse_inside_zarr, rmtree_named
from .._version import __version__
from ..errors import (
    InputError,
    NotAStoreError,
    ProbeMismatchError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
)
from ..probe import ProbeSet
from .fit import LOCK_KEY as FIT_LOCK_KEY
from .locks import CREATING, LOCK_NAME, KeyLock, owner, refuse_if_live
from .probe_io import read_probe, write_probe
from .run import Run
from .writer import run_meta_crc
from .schema import (
    AXES,
    COORD_CHUNK,
    COORDS,
    DEFAULT_TOKEN_CHUNK,
    INTEGRITY,
    LOSS_DTYPES,
    SCHEMA_VERSION,
    STORE_KIND,
    check_run_name,
    check_url,
    check_zarr,
    damage,
    local_url,
    check_writer_ranges,
    compressor,
    folders,
    has_keys,
    join,
    jsonable,
    once,
    operation,
    utc_now,
)

__all__ = ["TrajectoryStore", "open_store", "as_store"]


def _delete_group(group: zarr.Group) -> None:
    """Remove everything under ``group`` (best effort)."""
    try:
        zarr_sync(group.store.delete_dir(group.path))
    except Exception:  # noqa: BLE001 - cleaning up after another error
        pass


def _existing_folder(url: str | os.PathLike) -> tuple[str, int] | None:
    """``(path, mode)`` when ``url`` is a local folder that exists (a store made in it must not
    take the folder away when it is discarded: the user made it, or mounted something there)."""
    path = os.fspath(url) if isinstance(url, os.PathLike) else url
    if not isinstance(path, str) or "://" in path:
        return None
    try:
        return (path, os.stat(path).st_mode) if os.path.isdir(path) and not os.path.islink(path) else None
    except OSError:
        return None


def _put_back(folder: tuple[str, int] | None) -> None:
    """Recreate ``folder`` (from :func:`_existing_folder`) with its mode if a clean-up removed it."""
    if folder is None or os.path.isdir(folder[0]):
        return
    try:
        os.mkdir(folder[0])
        os.chmod(folder[0], folder[1] & 0o7777)
    except OSError:
        pass


class _StoreExistsError(StoreError):
    """:meth:`TrajectoryStore.create` found a store (or another zarr node) where it would make one."""


class StoreCreatedMeanwhileError(_StoreExistsError):
    """:meth:`TrajectoryStore.create` lost to another process creating the same store."""


# the tokens of the store creations in progress in this process (its threads): a creation marker
# of this process is abandoned only when its token is not here
_CREATING_HERE: set[str] = set()


def _claim_store(url: str | os.PathLike, storage_options: Mapping | None, marker: Mapping) -> zarr.Group:
    """The root group of a new store with its creation marker, claimed exclusively: its
    zarr.json is written only where none is (one atomic create on a local disk), as a run's name
    is claimed. Of two processes creating one store at once exactly one goes on; the other gets
    :class:`StoreCreatedMeanwhileError` and deletes nothing (zarr's "w-" looked, then wrote: both went
    on, and the loser's clean-up deleted the store the winner was filling, which it then
    reported made). Anything at the location, a group or not, is ``ContainsGroupError``."""
    path = os.fspath(url)
    if "://" in path:
        store: Any = zarr.storage.FsspecStore.from_url(path, storage_options=dict(storage_options or {}), read_only=False)
    else:
        store = zarr_sync(RegularFilesStore.open(root=path, mode="a"))
    if any(zarr_sync(store.exists(k)) for k in ("zarr.json", ".zgroup", ".zarray")):  # a zarr node, of either format
        raise zarr.errors.ContainsGroupError(path)
    _write_creation_marker(store, "zarr.json", marker)
    try:
        group = zarr.open_group(store=store, mode="r+")
        mine = _made_by(group, marker)
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError, FileNotFoundError,
            zarr.errors.GroupNotFoundError, zarr.errors.NodeTypeValidationError):  # fmt: skip
        mine = False  # the other's zarr.json half-written, or already replaced
    if not mine:
        raise StoreCreatedMeanwhileError(f"{path} was created by another process or thread at the same moment; open it "
                                         "(open_store with mode 'a' waits for it and opens it)")  # fmt: skip
    return group


def _write_creation_marker(store, key: str, marker: Mapping) -> None:
    """The zarr.json of a group holding the creation ``marker``, written at ``key`` only where
    none is (one atomic create on a local disk): how a new store or run is claimed."""
    doc = GroupMetadata(attributes={CREATING: marker}).to_buffer_dict(default_buffer_prototype())["zarr.json"]
    zarr_sync(StorePath(store, key).set_if_not_exists(doc))


def _made_by(group, marker: Mapping) -> bool:
    """Whether ``group`` is a group holding the creation ``marker`` (its token), read back after
    :func:`_write_creation_marker`."""
    return isinstance(group, zarr.Group) and (group.attrs.get(CREATING) or {}).get("token") == marker["token"]


def _tokdyn_at(url: str | os.PathLike, storage_options: Mapping | None) -> bool:
    """Whether ``url`` holds a tokdyn store or a creation of one (a zarr group of tokdyn's)."""
    try:
        attrs = _open_group(url, "r", storage_options).attrs
        return "tokdyn" in attrs or CREATING in attrs
    except Exception:  # noqa: BLE001 - unreadable or not a group: not one of ours
        return False


def _open_group(url: str | os.PathLike, mode: str, storage_options: Mapping | None = None, **kwargs) -> zarr.Group:
    check_zarr()  # python -O: zarr reads no group (said once, not as damage)
    # fsspec's options are for a URL; a local path (a file:// URL made one) opens zarr's own
    # local store, which refuses them ("storage_options was provided but unused")
    if storage_options and "://" in os.fspath(url):
        kwargs["storage_options"] = dict(storage_options)
    store: Any = str(url) if isinstance(url, os.PathLike) else url
    if "://" not in store:  # a local store: read through the check below; opened as zarr opens a path (r+ creates nothing)
        store = zarr_sync(RegularFilesStore.open(root=store, mode=mode, read_only=mode == "r"))
    return zarr.open_group(store=store, mode=mode, **kwargs)


class RegularFilesStore(LocalStore):
    """zarr's local store, reading only regular files: a key that is a FIFO would block the read
    forever and one that is a link to a device (``/dev/zero``) would never end, so either is a
    :class:`StoreError` naming it (a store holds files and folders only). Missing keys are left
    to zarr, which reads them as absent. A key that is a folder (a chunk or a metadata file
    replaced by one) is a :class:`StoreError` naming it, read or written: zarr read it as
    absent, said as "chunk files of this row are missing" (the file is there, as a folder), and
    its write failed as "[Errno 21] Is a directory: '...partial' -> ...", so a `--repair` named
    for it never mended it."""

    async def get(self, key: str, prototype=None, byte_range=None):
        _check_store_file(self.root / key)
        return await super().get(key, prototype, byte_range)

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        for key, _ in key_ranges:
            _check_store_file(self.root / key)
        return await super().get_partial_values(prototype, key_ranges)

    async def _set(self, key: str, value, exclusive: bool = False) -> None:
        if os.path.isdir(self.root / key):
            raise _folder_error(self.root / key)
        return await super()._set(key, value, exclusive)

    async def delete_dir(self, prefix: str) -> None:
        # zarr's rmtree named a file it could not delete by its name alone ("Read-only file
        # system: 'zarr.json'", replacing a read-only store): named by its path here
        self._check_writable()
        path = self.root / prefix
        if path.is_dir():
            rmtree_named(path)
        else:
            await super().delete_dir(prefix)


def _can_be_run_name(name: str) -> bool:
    """Whether run ``name`` is one a reader can open by name (:func:`check_run_name`)."""
    try:
        check_run_name(name)
    except InputError:
        return False
    return True


def _folder_error(path) -> StoreError:
    return StoreError(f"{path} is a folder where the store keeps a file (a chunk or metadata, replaced by a folder); tokdyn "
                      "neither reads nor replaces it: remove that folder, and the store then reads the file as missing")  # fmt: skip


def _check_store_file(path) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing, a name too long, ...: zarr's own read says it
        return
    if stat.S_ISDIR(mode):
        raise _folder_error(path)
    if not stat.S_ISREG(mode):
        kind = kind_of_mode(mode)
        raise StoreError(f"{path} is {kind}{link_note(path)}, not a regular file; a store holds only files and folders, and tokdyn "
                         "does not read it (a FIFO would block the read forever, a device never end)")  # fmt: skip


def _lock_keys(store, prefix: str) -> list[str]:
    """The writer-lock keys under ``prefix`` (a run's token-range writers, its fit)."""
    names = {LOCK_NAME, FIT_LOCK_KEY[-1]}

    async def keys() -> list[str]:
        return [k async for k in store.list_prefix(prefix) if k.rsplit("/", 1)[-1] in names]

    return zarr_sync(keys())


class TrajectoryStore:
    """A tokdyn store. Open one with :func:`open_store` (or :meth:`create` / :meth:`open`).

    Attributes
    ----------
    url : str
        Where the store lives (a local path or an fsspec URL).
    probe_fingerprint : str
        Fingerprint of the probe every run in the store was evaluated on.
    """

    def __init__(self, group: zarr.Group, url: str, *, writable: bool, storage_options: Mapping | None = None) -> None:
        meta = group.attrs.get("tokdyn")
        if not isinstance(meta, Mapping) or meta.get("kind") != STORE_KIND:
            raise NotAStoreError(f"{url} is a zarr group but not a tokdyn store (no attrs['tokdyn'] of kind {STORE_KIND!r})")
        version = meta.get("schema_version")
        if version != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{url} has store schema version {version!r}; this tokdyn ({__version__}) reads version {SCHEMA_VERSION}"
            )
        self._group = group
        self.url = url
        self.writable = writable
        self.storage_options: dict = dict(storage_options or {})
        fingerprint = meta.get("probe_fingerprint")
        if not isinstance(fingerprint, str):
            raise StoreError(f"{url}: the store's metadata is damaged (its probe_fingerprint is "
                             f"{'missing' if fingerprint is None else type(fingerprint).__name__}, not a string)")  # fmt: skip
        self.probe_fingerprint: str = fingerprint
        self._probe: ProbeSet | None = None
        self.created = False  # made by this object (create, or open_store mode "a"/"w" on nothing)
        self._folder_before: tuple[str, int] | None = None  # a local folder that was there before create()
        # runs this object created, each by its creation marker's token, then its run id: discard_if_new
        # removes no other's, nor one made again under its name meanwhile
        self._made_runs: dict[str, str] = {}

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def create(
        cls, url: str | os.PathLike, probe: ProbeSet, *, overwrite: bool = False, storage_options: Mapping | None = None
    ) -> "TrajectoryStore":
        """Create a new store for ``probe`` at ``url``; an existing one is an error unless ``overwrite``."""
        if not isinstance(probe, ProbeSet):
            raise InputError(f"probe must be a ProbeSet, got {type(probe).__name__}")
        check_url(url)
        url = local_url(url)
        # a new store inside a zarr hierarchy (another store, a run's folder) is refused: the outer
        # store owns its folders (a refit of the outer run deleted a store imported into its fit folder)
        refuse_inside_zarr(url, "store")
        existed = _existing_folder(url)
        token = uuid.uuid4().hex
        _CREATING_HERE.add(token)  # a thread of this process finding the marker waits for it, never replaces it
        try:
            return cls._create(url, probe, overwrite, storage_options, existed, token)
        finally:
            _CREATING_HERE.discard(token)

    @classmethod
    def _create(cls, url, probe, overwrite, storage_options, existed, token) -> "TrajectoryStore":
        try:  # the group is born with a marker naming its creator, so a killed creation is recognised
            marker = {**owner(), "token": token}
            if overwrite:
                group = _open_group(url, "w", storage_options, attributes={CREATING: marker})
            else:
                group = _claim_store(url, storage_options, marker)
        except (OSError, zarr.errors.ContainsGroupError, zarr.errors.ContainsArrayError) as exc:
            there = not_a_folder(url)
            if there:  # a file, FIFO or link to nothing where the store's folder would be, or above it
                raise StoreError(f"cannot make a store at {url} ({there}); give a new path") from None
            if isinstance(exc, OSError) and not isinstance(exc, (FileExistsError, NotADirectoryError)):
                raise  # a permission denied, a full disk: said as such by the caller
            raise _StoreExistsError(f"{url} already exists; open it, or pass overwrite=True to replace it") from None
        try:
            write_probe(group.create_group("probe"), probe)
            group.create_group("runs")
        except BaseException:
            _delete_group(group)  # never leave a half-made store that blocks the next attempt
            _put_back(existed)
            raise
        # The root attribute is written last (replacing the marker, one write): a store is
        # recognised only once its probe is whole.
        group.attrs.put({"tokdyn": {
            "kind": STORE_KIND,
            "schema_version": SCHEMA_VERSION,
            "probe_fingerprint": probe.fingerprint,
            "tokdyn_version": __version__,
            "zarr_version": zarr.__version__,
            "created": utc_now(),
        }})
        store = cls(group, url, writable=True, storage_options=storage_options)
        store._probe = probe
        store.created = True
        store._folder_before = existed
        return store

    @classmethod
    def open(
        cls, url: str | os.PathLike, *, mode: str = "r", storage_options: Mapping | None = None
    ) -> "TrajectoryStore":
        """Open an existing store, read-only (``mode="r"``) or for appending (``"r+"``)."""
        if mode not in ("r", "r+"):
            raise InputError(f"mode must be 'r' or 'r+', got {mode!r}")
        check_url(url)
        url = local_url(url)
        try:
            group = _open_group(url, mode, storage_options)
        # (a file at the path, or one above it: mode "r+" makes the store's folder, "[Errno 17] File exists")
        except (FileNotFoundError, FileExistsError, NotADirectoryError, zarr.errors.GroupNotFoundError,
                zarr.errors.NodeTypeValidationError):  # fmt: skip
            there = not_a_folder(url)
            raise NotAStoreError(f"no tokdyn store at {url}" + (f" ({there})" if there else "")) from None
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError, KeyError, RecursionError) as exc:
            raise StoreError(f"{url}: store metadata is unreadable ({damage(exc)})") from None
        return cls(group, url, writable=mode == "r+", storage_options=storage_options)

    # -- probe ----------------------------------------------------------------------------

    def _replaced(self) -> str | None:
        """What became of the store at :attr:`url` since this object opened it, where it is no
        longer that store: ``"deleted after ..."``, or ``"replaced by another store after ..."`` (a store of
        another probe: a demo made again, a script's mode ``"w"``, while a notebook or a recorder
        held it); None where it is the same store. This object's probe (read once, cached) and
        fingerprint are the old store's: a run read through it was paired with the old probe's
        tokens, domains and documents without a word, and a run created through it was recorded
        with the old probe into a store of another. A store replaced by one of the same probe
        reads on (each :class:`Run` view tells its own run from one made again). The one check
        of every reader, creator and deleter here, and of a writer that lost its lock."""
        try:
            meta = zarr.open_group(store=self._group.store, path=self._group.path, mode="r").attrs.get("tokdyn")
        except (FileNotFoundError, zarr.errors.GroupNotFoundError):
            return "deleted after this object opened it"
        except (KeyError, ValueError, TypeError, RecursionError):  # damaged metadata: the reads say it, as before
            return None
        now = meta.get("probe_fingerprint") if isinstance(meta, Mapping) else None
        if now != self.probe_fingerprint:
            return (f"replaced by another store after this object opened it (its probe is now {now or 'not yet written'}, "
                    f"this object's {self.probe_fingerprint})")
        return None

    def _require_same_store(self) -> None:
        """:class:`StoreError` when the store at :attr:`url` is no longer the one this object
        opened (:meth:`_replaced`); once per operation (:func:`~tokdyn.store.schema.operation`:
        ``info`` read the store's metadata once for itself, once for its probe and once for each run)."""

        def check() -> None:
            what = self._replaced()
            if what is not None:
                raise StoreError(f"{self.url} was {what}: open it again (tokdyn.open_store({self.url!r}))")

        once(self, "checked", check)

    @property
    def probe(self) -> ProbeSet:
        """The probe set, read from the store once and cached."""
        if self._probe is None:
            self._require_same_store()
            self._probe = read_probe(self.probe_group())
            if self._probe.fingerprint != self.probe_fingerprint:
                raise StoreError(
                    f"{self.url}: probe content hashes to {self._probe.fingerprint}, store records "
                    f"{self.probe_fingerprint}; the probe arrays were modified or damaged"
                )
        return self._probe

    def probe_group(self) -> zarr.Group:
        """The store's ``probe`` group; StoreError where it is missing or not a group (its
        zarr.json deleted or damaged): no run can be read against a probe that is not there."""
        try:
            g = self._group["probe"]
        except (KeyError, FileNotFoundError, zarr.errors.NodeTypeValidationError):
            g = None
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError, RecursionError) as exc:
            raise StoreError(f"{self.url}: the probe group's metadata is unreadable ({damage(exc)})") from None
        if not isinstance(g, zarr.Group):
            raise StoreError(f"{self.url}: the probe group is missing or damaged (no probe/zarr.json of a group); "
                             "the store cannot be read")  # fmt: skip
        return g

    def check_probe(self, probe: ProbeSet) -> None:
        """Raise :class:`ProbeMismatchError` unless ``probe`` is the store's probe."""
        if probe.fingerprint != self.probe_fingerprint:
            raise ProbeMismatchError(
                f"probe fingerprint {probe.fingerprint} differs from the store's {self.probe_fingerprint} "
                f"({self.url}); a store holds runs on one probe only, use another store for this probe"
            )

    # -- runs -----------------------------------------------------------------------------

    @property
    def runs(self) -> list[str]:
        """Names of the runs in the store, sorted: a run whose zarr.json is lost too, and a run
        that is a link leading nowhere (its folder moved or deleted), which read as damaged: it
        was left out, so info said nothing of it and readers said there was no such run. A name
        no run can have (a hidden folder or link, ``.old``, ``.ipynb_checkpoints``) is no run: it
        is left out (listed, it made ``tokdyn info`` fail on its name, and no run was shown)."""
        names = folders(self._group.store, join(self._group.path, "runs"))
        return sorted(n for n in {*names, *self._broken_links()} if _can_be_run_name(n))

    def _broken_link_error(self, name: str) -> StoreError:
        """What every reader and creator of run ``name``, a link leading nowhere, says."""
        return StoreError(f"run {name!r} in {self.url} is a link to {self.linked_run(name)}, which is not there (moved or "
                          f"deleted): link the run's folder again, or delete the link "
                          f"({command_line('tokdyn delete-run', self.url, ('--run', name))})")  # fmt: skip

    def _local_runs(self) -> str | None:
        """The ``runs`` folder of a local store on disk, or None (a store that is not local)."""
        root = getattr(self._group.store, "root", None)
        return None if root is None else os.path.join(root, join(self._group.path, "runs"))

    def _broken_links(self) -> list[str]:
        """Names under ``runs`` of a local store that are links leading nowhere."""
        runs = self._local_runs()
        if runs is None:
            return []
        try:
            with os.scandir(runs) as entries:
                return [e.name for e in entries if e.is_symlink() and not os.path.exists(e.path) and not e.name.endswith(".partial")]
        except OSError:  # no runs folder (a damaged store: said where it is read), or one that cannot be listed
            return []

    def run(self, name: str) -> "Run":
        """A read view of run ``name``."""
        check_run_name(name)
        self._require_same_store()
        try:
            g = self._group[f"runs/{name}"]
        except KeyError:
            if name in self._broken_links():
                raise self._broken_link_error(name) from None
            if name in self.runs:
                raise StoreError(f"run {name!r} in {self.url} is damaged: its group metadata (runs/{name}/zarr.json) is missing") from None
            raise RunNotFoundError(f"no run {name!r} in {self.url}; runs: {', '.join(self.runs) or 'none'}") from None
        except (ValueError, TypeError, RecursionError) as exc:  # a zarr.json cut short, overwritten, nested past the parser
            raise StoreError(f"run {name!r} in {self.url}: metadata unreadable ({damage(exc)})") from None
        return Run(self, name, g)

    def create_run(
        self,
        name: str,
        *,
        axis: str = "T",
        capacity: int = 16,
        dtype: str = "float32",
        token_chunk: int | None = None,
        writers: Sequence[tuple[int, int]] | None = None,
        attrs: Mapping[str, Any] | None = None,
        codec: str = "lz4",
    ) -> "Run":
        """Create an empty run; write rows with :meth:`Run.writer`.

        Parameters
        ----------
        axis : {"T", "D", "M"}
            What the rows index: checkpoints of one run (T), data budgets (D), model sizes (M).
        capacity : int
            Rows allocated ahead (a single writer grows the arrays when it runs out).
        dtype : {"float32", "float16", "float64"}
            Storage dtype of the losses.
        token_chunk : int, optional
            Tokens per chunk; by default about 262144, rounded to whole probe sequences.
        writers : list of (start, stop), optional
            Token ranges written by separate processes (distributed ranks); they must tile
            ``[0, N)`` in order and start on chunk boundaries. Default: one writer for all tokens.
        attrs : dict, optional
            JSON-able run metadata: ``model_config``, ``n_params``, ``n_params_non_embedding``,
            ``data_budget``, ``seed``, and anything else.
        codec : {"lz4", "zstd", "none"}
            Compression of the loss chunks.
        """
        self.require_writable()
        check_run_name(name, new=True)
        self._require_same_store()
        if name in self.runs:
            if self.has_run(name):
                raise RunExistsError(f"run {name!r} already exists in {self.url}; resume it or choose another name")
            if name in self._broken_links():  # its claim wrote through the link, and read as another process's run
                raise self._broken_link_error(name)
            self._discard_aborted_run(name)
        if axis not in AXES:
            raise InputError(f"axis must be one of {AXES}, got {axis!r}")
        if dtype not in LOSS_DTYPES:
            raise InputError(f"dtype must be one of {LOSS_DTYPES}, got {dtype!r}")
        cap = check_count("capacity", capacity)
        n = self.probe.n_tokens
        chunk = self._token_chunk(token_chunk)
        compressors = compressor(codec)
        ranges = [(0, n)] if writers is None else [(int(a), int(b)) for a, b in writers]
        check_writer_ranges(ranges, n, chunk)
        run_attrs = jsonable(dict(attrs or {}), "run attrs")
        g = self._claim_run_name(name)
        g.create_array(
            "loss", shape=(cap, n), chunks=(1, chunk), dtype=dtype, fill_value=np.nan,
            dimension_names=("checkpoint", "token"), compressors=compressors,
            attributes={"units": "nats", "long_name": "per-token cross-entropy", "coordinates": " ".join(COORDS)},
        )  # fmt: skip
        for cname, (cdtype, fill) in COORDS.items():
            g.create_array(cname, shape=(cap,), chunks=(COORD_CHUNK,), dtype=cdtype, fill_value=fill, dimension_names=("checkpoint",),
                           compressors=compressor())  # fmt: skip
        commits = g.create_group("commits")
        for j in range(len(ranges)):
            commits.create_group(f"w{j}", attributes={"rows": 0, "last_step": None, "nonfinite": 0, "nonfinite_rows": {}})
        # Written last, replacing the marker: a run group without it is an aborted creation
        # (it holds no committed row: writers need this metadata).
        meta = {**run_attrs, "axis": axis, "dtype": dtype, "token_chunk": chunk, "codec": codec, "writers": [list(r) for r in ranges]}
        run_id = uuid.uuid4().hex
        meta["integrity"] = {"run_id": run_id, "checksums": INTEGRITY, "meta_crc": run_meta_crc(run_id, meta)}
        g.attrs.put({"tokdyn_run": {**meta, "schema_version": SCHEMA_VERSION, "tokdyn_version": __version__, "created": utc_now()}})
        self._made_runs[name] = run_id
        return Run(self, name, g)

    def _claim_run_name(self, name: str) -> zarr.Group:
        """Create the group of run ``name`` with its creation marker, exclusively: its zarr.json
        is written only if absent (one atomic create), so of two processes creating the same run
        at once exactly one goes on, and the other gets one clear error, not zarr's
        ``ContainsGroupError``, nor (had both writes landed) a run whose metadata the other's
        overwrote."""
        marker = {**owner(), "token": uuid.uuid4().hex}
        _write_creation_marker(self._group.store, join(self._group.path, "runs", name, "zarr.json"), marker)
        try:
            g = self._group[f"runs/{name}"]
            mine = _made_by(g, marker)
        except (KeyError, ValueError, TypeError, AttributeError, RecursionError):
            mine = False
        if not mine:
            raise RunBusyError(f"run {name!r} of {self.url} was created by another process at the same time; "
                               "this one leaves it to that one (resume it, or choose another name)")  # fmt: skip
        self._made_runs[name] = marker["token"]
        return g

    def has_run(self, name: str) -> bool:
        """Whether run ``name`` exists and its creation finished (an aborted one is replaced by
        :meth:`create_run`)."""
        check_run_name(name)
        if name not in self.runs:
            return False
        try:
            return isinstance(self._group[f"runs/{name}"].attrs.get("tokdyn_run"), Mapping)
        except (KeyError, ValueError, TypeError, RecursionError):
            return False

    def _discard_aborted_run(self, name: str) -> None:
        """Remove a run group whose creation never finished (no committed row can be in it),
        unless its creator is still alive (:class:`RunBusyError`)."""
        try:
            creator = self._group[f"runs/{name}"].attrs.get(CREATING)
        except KeyError:  # no group metadata: a creation killed while writing it leaves nothing else
            if has_keys(self._group.store, join(self._group.path, "runs", name) + "/"):
                raise StoreError(f"run {name!r} in {self.url} is damaged (its zarr.json is missing) but holds data; "
                                 f"it is not replaced: delete it ({command_line('tokdyn delete-run', self.url, ('--run', name))}), or use another run name") from None  # fmt: skip
            creator = None
        except (ValueError, TypeError, RecursionError):
            creator = None
        if creator is not None:
            refuse_if_live(creator, f"run {name!r} of {self.url} is being created")
        zarr_sync(self._group.store.delete_dir(join(self._group.path, "runs", name)))

    def discard_if_new(self) -> bool:
        """Remove the whole store if this object created it and it holds no committed row and no
        run another process made meanwhile (two first recordings at once: the other may hold its
        writer): what a command that failed half-way calls, so that it leaves no new store behind.
        A store replaced meanwhile (:meth:`_replaced`) is another's, and a run deleted and made
        again under a name this object used another process's: both are left as they are (the
        replaced store, rows of another recording included, was removed as an aborted creation).
        Returns whether the store was removed."""
        if not (self.created and self.writable) or self._replaced() is not None:
            return False
        for name in self.runs:
            if not self._made_here(name):  # another process made it meanwhile (and may be writing it): its store too
                return False
            try:
                if self.run(name).n_committed:
                    return False
            except StoreError:  # an aborted run creation: no rows
                continue
        _delete_group(self._group)
        root = getattr(self._group.store, "root", None)  # a local folder: remove it too, unless it was there before
        before = getattr(self, "_folder_before", None)
        if root is not None and not self._group.path and before is None:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        _put_back(before)
        return True

    def _made_here(self, name: str) -> bool:
        """Whether run ``name`` is the one this object created: its run id, or, where its creation
        never finished, its creation marker is this object's (a group whose metadata is lost holds
        nothing that tells: this object's where it made a run of that name)."""
        made = self._made_runs.get(name)
        if made is None:
            return False
        try:
            attrs = self._group[f"runs/{name}"].attrs
        except (KeyError, ValueError, TypeError, RecursionError, zarr.errors.NodeTypeValidationError):
            return True
        meta, marker = attrs.get("tokdyn_run"), attrs.get(CREATING)
        if isinstance(meta, Mapping):
            integrity = meta.get("integrity")
            return isinstance(integrity, Mapping) and integrity.get("run_id") == made
        return isinstance(marker, Mapping) and marker.get("token") == made

    def linked_run(self, name: str) -> str | None:
        """Where the folder of run ``name`` leads when it is a link (a run of another store, or
        of a folder elsewhere, linked into this one), else None (a folder of this store, or a
        store that is not local)."""
        runs = self._local_runs()
        path = None if runs is None else os.path.join(runs, name)
        return os.path.realpath(path) if path is not None and os.path.islink(path) else None

    def delete_run(self, name: str) -> None:
        """Remove run ``name`` and everything stored under it (its fit too), damaged or not (a
        run whose metadata is lost or unreadable could not be deleted, and blocked its name).
        A run whose folder is a link (:meth:`linked_run`) is removed as a link: what it leads to
        is another store's, and is left as it is (deleting through the link removed the other
        store's run metadata, then failed).

        :class:`RunNotFoundError` where there is no such run; :class:`RunBusyError`, removing
        nothing, while another live process creates it, records into it or fits it (its
        creation marker or a writer lock names that process): its next write would land in a
        run that is gone. A lock left by a crashed process does not hold a deletion up. The
        run's writer and fit locks are then taken by this process until the run is gone, so no
        writer or fit can start in between; its group metadata goes first, so no reader opens a
        run half deleted."""
        self.require_writable()
        check_run_name(name)
        self._require_same_store()  # a held handle of a store replaced meanwhile deleted the new store's run
        store, where = self._group.store, join(self._group.path, "runs", name)
        if name not in self.runs and not has_keys(store, where + "/"):  # (a legacy name the listing leaves out)
            raise RunNotFoundError(f"no run {name!r} in {self.url}; runs: {', '.join(self.runs) or 'none'}")
        rel = (lambda key: key[len(self._group.path) + 1 :]) if self._group.path else (lambda key: key)  # noqa: E731
        try:
            creator = self._group[f"runs/{name}"].attrs.get(CREATING)
        except (KeyError, ValueError, TypeError, RecursionError, StoreError,
                zarr.errors.NodeTypeValidationError):  # damaged: no creator to ask  # fmt: skip
            creator = None
        if creator is not None:
            refuse_if_live(creator, f"run {name!r} of {self.url} is being created",
                           if_gone=f"remove the attribute {CREATING!r} from runs/{name}/zarr.json and delete it again")  # fmt: skip
        keys = set(_lock_keys(store, where + "/commits/"))
        for key in sorted(keys):
            holder = KeyLock(store, key, what="", if_gone="").holder()
            if holder is not None:
                refuse_if_live(holder, f"run {name!r} of {self.url} is being written ({rel(key)})",
                               if_gone=f"remove the lock {rel(key)} and delete it again")  # fmt: skip
        if self.linked_run(name) is not None:  # the link alone: its locks are taken in the other store by its own writers
            os.unlink(os.path.join(store.root, where))
            return
        try:
            writers = len(self.run(name).writers)
        except StoreError:  # damaged: the locks found are all there is to take
            writers = 0
        keys |= {join(where, *FIT_LOCK_KEY)} | {join(where, "commits", f"w{j}", LOCK_NAME) for j in range(writers)}
        held: list[KeyLock] = []
        try:
            for key in sorted(keys):  # a writer or fit that started since the check is refused here, or refused by these
                lock = KeyLock(store, key, what=f"run {name!r} of {self.url} ({rel(key)})",
                               if_gone=f"remove the lock {rel(key)} and delete it again")  # fmt: skip
                lock.claim()
                held.append(lock)
            zarr_sync(store.delete(join(where, "zarr.json")))
            zarr_sync(store.delete_dir(where))
        except BaseException:
            for lock in held:
                lock.release()
            raise

    def _token_chunk(self, token_chunk: int | None) -> int:
        c = self.probe.context or 1
        n = self.probe.n_tokens
        if token_chunk is None:
            token_chunk = max(c, (DEFAULT_TOKEN_CHUNK // c) * c)
            return min(token_chunk, -(-n // c) * c)
        token_chunk = check_count("token_chunk", token_chunk)  # a float is never cut to an int
        if token_chunk % c:
            raise InputError(f"token_chunk must be a positive multiple of the probe context {c}, got {token_chunk}")
        return token_chunk

    def require_writable(self) -> None:
        if not self.writable:
            raise StoreError(f"{self.url} is open read-only; open it with mode='r+' to write")

    # -- description ----------------------------------------------------------------------

    def size_bytes(self) -> int | None:
        """Bytes the store takes on its storage (None where the backend cannot say, or a folder
        of a local store cannot be listed: rglob skipped it without a word, and a fit folder
        readable but not listable read as 0.02 MB of 0.07)."""
        st = self._group.store
        root = getattr(st, "root", None)
        if root is not None:
            failed: list[OSError] = []
            total = 0
            def fail(exc: OSError) -> None:  # a file or folder gone meanwhile (a write's rename, a refit's swap) is no failure
                if not isinstance(exc, FileNotFoundError):
                    failed.append(exc)

            for folder, _, files in os.walk(root, onerror=fail):
                for name in files:
                    try:
                        total += os.lstat(os.path.join(folder, name)).st_size
                    except OSError as exc:
                        fail(exc)
            return None if failed else total
        fs = getattr(st, "fs", None)
        if fs is not None:
            try:
                if getattr(fs, "asynchronous", False):  # zarr's fsspec filesystems are async
                    return int(zarr_sync(fs._du(st.path, total=True)))
                return int(fs.du(st.path, total=True))
            except Exception:  # noqa: BLE001 - size is informative only
                return None
        return None

    def info(self) -> dict:
        """A JSON-able description: probe, runs (shapes, steps, NaNs), size on disk."""
        with operation(self):
            self._require_same_store()  # the cached probe beside another store's runs, or none at all
            return self._info()

    def _info(self) -> dict:
        runs = {}
        for name in self.runs:
            try:
                runs[name] = self.run(name).info()
            except StoreError as exc:
                runs[name] = {"error": str(exc)}
        return {
            "url": self.url,
            "schema_version": SCHEMA_VERSION,
            "probe": self.probe.summary(),
            "runs": runs,
            "size_bytes": self.size_bytes(),
        }

    def __repr__(self) -> str:
        return f"TrajectoryStore({self.url!r}, probe={self.probe_fingerprint}, runs={self.runs})"


def open_store(
    url: str | os.PathLike,
    probe: ProbeSet | None = None,
    *,
    mode: str = "a",
    storage_options: Mapping | None = None,
) -> TrajectoryStore:
    """Open a store, creating it for ``probe`` when ``mode="a"`` and nothing is there.

    ``mode``: ``"r"`` read-only, ``"r+"`` existing store for writing, ``"a"`` open or create
    (needs ``probe``), ``"w"`` create, replacing what is there (needs ``probe``). When a
    ``probe`` is given for an existing store, its fingerprint must match.
    """
    if mode not in ("r", "r+", "a", "w"):
        raise InputError(f"mode must be one of 'r', 'r+', 'a', 'w', got {mode!r}")
    check_url(url)
    url = local_url(url)
    if storage_options and "://" not in os.fspath(url):
        warnings.warn(f"storage_options are for fsspec URLs; the local path {os.fspath(url)} takes none (ignored)",
                      UserWarning, stacklevel=2)  # fmt: skip
        storage_options = None
    if probe is not None and not isinstance(probe, ProbeSet):
        raise InputError(f"probe must be a ProbeSet, got {type(probe).__name__}")
    if mode == "w":
        if probe is None:
            raise InputError("creating a store needs a probe")
        return TrajectoryStore.create(url, probe, overwrite=True, storage_options=storage_options)
    if mode == "a":
        polls, start = 0, time.monotonic()
        while True:
            try:
                store = TrajectoryStore.open(url, mode="r+", storage_options=storage_options)
                break
            except NotAStoreError:
                if probe is None:
                    raise
                try:
                    if _aborted_creation(url, storage_options):  # a creator killed half-way: start again
                        return TrajectoryStore.create(url, probe, overwrite=True, storage_options=storage_options)
                    if not _exists_nonempty(url, storage_options):
                        return TrajectoryStore.create(url, probe, storage_options=storage_options)
                except (RunBusyError, _StoreExistsError) as exc:
                    # another process is creating it (its probe being written), or made it between
                    # the look above and the claim: wait for it, then open it; a zarr node of
                    # another tool is no creation, and is not waited for
                    foreign = type(exc) is _StoreExistsError and not _tokdyn_at(url, storage_options)
                    if foreign or time.monotonic() - start > _CREATION_WAIT_S:
                        raise
                else:
                    polls += 1
                    if polls > _CREATION_POLLS:
                        raise
                # another process may be creating it this moment, its creation marker not yet
                # written (a script launched twice at once got "no tokdyn store" 1 time in 8)
                time.sleep(_CREATION_POLL_S)
    else:
        store = TrajectoryStore.open(url, mode=mode, storage_options=storage_options)
    if probe is not None:
        store.check_probe(probe)
        store._probe = store._probe or probe
    return store


# How long a location that holds something but no store (yet) is watched for a creation in
# progress before it is said to be no store: 10 looks, 50 ms apart.
# A creation in progress in a live process (its marker written) is waited for up to 30 s.
_CREATION_POLLS, _CREATION_POLL_S, _CREATION_WAIT_S = 10, 0.05, 30.0


def _aborted_creation(url: str | os.PathLike, storage_options: Mapping | None) -> bool:
    """True when ``url`` holds a store whose creation never finished and whose creator is gone.
    A creation still in progress in a live process is :class:`RunBusyError`."""
    try:
        attrs = dict(_open_group(url, "r", storage_options).attrs)
    except Exception:  # noqa: BLE001 - not a zarr group at all: not ours to replace
        return False
    if "tokdyn" in attrs or CREATING not in attrs:
        return False
    marker = attrs[CREATING]
    if refuse_if_live(marker, f"store {url} is being created") == "self" and isinstance(marker, Mapping) \
            and marker.get("token") in _CREATING_HERE:  # fmt: skip
        # another thread of this process is creating it (a pool of imports): replacing it deleted
        # the store that thread then reported made
        raise RunBusyError(f"store {url} is being created by another thread of this process")
    return True


def _exists_nonempty(url: str | os.PathLike, storage_options: Mapping | None) -> bool:
    """True when ``url`` holds anything (so creating a store there would clobber it)."""
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(os.fspath(url), **dict(storage_options or {}))
        return bool(fs.exists(path) and (not fs.isdir(path) or fs.ls(path)))
    except Exception:  # noqa: BLE001 - be conservative: only an empty/missing location is created
        return False




def as_store(store: "TrajectoryStore | str | os.PathLike", *, mode: str = "r", storage_options: Mapping | None = None) -> "TrajectoryStore":
    """``store`` itself when it is an open :class:`TrajectoryStore`, else the store at that path
    or URL opened with ``mode`` ("r" or "r+"). An open store asked for writing must be writable."""
    if isinstance(store, TrajectoryStore):
        if mode == "r+":
            store.require_writable()
        return store
    if mode not in ("r", "r+"):
        raise InputError(f"mode must be 'r' or 'r+', got {mode!r}")
    return open_store(store, mode=mode, storage_options=storage_options)
