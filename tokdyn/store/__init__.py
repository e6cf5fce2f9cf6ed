"""The store package: it alone knows where anything lives on disk.

One zarr v3 hierarchy holds one probe set and any number of runs (docs/store.md is the schema):

- ``schema``: version, names, dtypes, chunking, codecs, and the checks on names and values;
- ``store``: :class:`TrajectoryStore` (create, open, list and create runs), :func:`open_store`,
  :func:`as_store` (a path, URL or open store -> an open store);
- ``run``: :class:`Run`, the read view of one run's committed rows, the handle every stage takes;
- ``writer``: :class:`RunWriter`, appending committed rows under a writer lock;
- ``fit``: :class:`FitResults` (``run.fit``), the fit results' layout, read and written in blocks;
- ``locks``: creation markers and writer locks that tell a crashed owner from a live one;
- ``probe_io``: the probe set inside a store.

Nothing outside this package opens a zarr group of a store.
"""

from .fit import FIT_SCHEMA_VERSION, FitResults, FitWriter
from .run import Run
from .schema import AXES, CODECS, COORDS, DEFAULT_TOKEN_CHUNK, LOSS_DTYPES, SCHEMA_VERSION, jsonable
from .store import TrajectoryStore, as_store, open_store
from .writer import RunWriter, check_row

__all__ = [
    "TrajectoryStore", "Run", "RunWriter", "check_row", "FitResults", "FitWriter", "open_store", "as_store",
    "SCHEMA_VERSION", "FIT_SCHEMA_VERSION", "LOSS_DTYPES", "AXES", "CODECS", "COORDS", "DEFAULT_TOKEN_CHUNK", "jsonable",
]  # fmt: skip
