"""The probe set inside a store: ``/probe`` holds the token matrix (absent for an imported
probe), one ``[token]`` array per per-token field, and the fingerprint, domains, documents and
tokenizer in its attributes (docs/store.md, "Probe")."""

from __future__ import annotations

import warnings

import numpy as np
import zarr

from ..errors import InputError, StoreError
from ..probe import ProbeSet
from .schema import NOT_DAMAGE, compressor, damage, folders

__all__ = ["write_probe", "read_probe"]


def write_probe(g: zarr.Group, probe: ProbeSet) -> None:
    if probe.tokens is not None:
        t = probe.tokens
        g.create_array("tokens", shape=t.shape, chunks=(max(1, min(t.shape[0], 4096)), t.shape[1]), dtype="int32",
                       dimension_names=("sequence", "position"), compressors=compressor())[...] = t  # fmt: skip
    n = probe.n_tokens
    for name, arr in probe.token_arrays.items():
        if name in ("tokens",) or not name.isidentifier():
            raise InputError(f"probe array name {name!r} is not allowed")
        with warnings.catch_warnings():  # fixed-width strings (npz metadata) have no v3 spec yet
            warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")
            g.create_array(name, shape=(n,), chunks=(min(n, 1 << 20),), dtype=arr.dtype, dimension_names=("token",),
                           compressors=compressor())[...] = arr  # fmt: skip
    g.update_attributes(
        {
            "fingerprint": probe.fingerprint,
            "n_tokens": n,
            "context": probe.context,
            "domains": list(probe.domains),
            "documents": list(probe.documents),
            "tokenizer": dict(probe.tokenizer),
            "token_arrays": list(probe.token_arrays),
        }
    )


def read_probe(g: zarr.Group) -> ProbeSet:
    a = dict(g.attrs)
    try:
        names = a["token_arrays"]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")
            nodes = {name: g[name] for name in names}
            if "tokens" in folders(g.store, g.path):  # a folder whose zarr.json is lost: damaged, not absent
                nodes["tokens"] = g["tokens"]
            for name, arr in nodes.items():  # object / variable-length dtypes are never read
                if not isinstance(arr, zarr.Array) or np.dtype(arr.dtype).kind not in "iufbUS":
                    raise StoreError(f"probe array {name!r} has dtype {getattr(arr, 'dtype', None)}; tokdyn reads numbers and fixed-width strings only")
            arrays = {name: nodes[name][...] for name in names}
        tokens = nodes["tokens"][...] if "tokens" in nodes else None
    except NOT_DAMAGE:  # out of memory too: it was called a damaged probe group
        raise
    except Exception as exc:  # noqa: BLE001 - a missing array, bad metadata, a chunk codecs cannot decode
        raise StoreError(f"probe group is incomplete or damaged: {damage(exc)}") from None
    try:
        return ProbeSet(tokens, arrays, domains=a.get("domains", ()), documents=a.get("documents", ()), tokenizer=a.get("tokenizer", {}),
                        stored=True)  # its names were checked when it was made (a store made before that still opens)
    except (InputError, TypeError, ValueError) as exc:  # a stored probe that no longer passes the checks a new one must
        # (or whose attributes are not of their kind: "domains": null was a TypeError, reported as a bug)
        raise StoreError(f"the store's probe group is damaged: {exc}") from None
