"""Measure the store's chunk layout: appending rows versus reading token blocks for fitting.

Three layouts of the same loss matrix [K checkpoints, N tokens], side by side in one process:

  rows      tokdyn's layout: chunks (1, token_chunk), one new chunk object per appended row
  sharded   zarr sharding: shards (64, token_chunk) of inner chunks (1, token_chunk); appending
            a row rewrites its whole shard
  blocks    chunks (K, token_chunk): the ideal read layout, writable only once all rows exist

For each: append throughput (row by row, as the recorder writes; for "blocks" one bulk write)
and the throughput of reading one token block across all rows (what the fitter reads).

    python pipelines/bench_store.py                 # the figures in docs/store.md
    python pipelines/bench_store.py --tokens 200000 --rows 40
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import BloscCodec

from tokdyn.store import DEFAULT_TOKEN_CHUNK


def codec():
    return BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1_048_576)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--chunk", type=int, default=DEFAULT_TOKEN_CHUNK)
    args = ap.parse_args()
    n, k, c = args.tokens, args.rows, args.chunk
    rng = np.random.default_rng(0)
    # Loss-like rows: a per-token level that decays over the rows, plus noise.
    base = rng.gamma(2.0, 1.5, n).astype(np.float32)
    rows = [(base * (0.3 + 0.7 * np.exp(-j / 20)) + rng.normal(0, 0.05, n)).astype(np.float32) for j in range(4)]
    mb = n * k * 4 / 1e6
    out = {"tokens": n, "n_rows": k, "token_chunk": c, "logical_MB": round(mb, 1)}
    with tempfile.TemporaryDirectory() as d:
        for layout in ("rows", "sharded", "blocks"):
            path = Path(d) / f"{layout}.zarr"
            g = zarr.open_group(str(path), mode="w")
            if layout == "rows":
                a = g.create_array("l", shape=(k, n), chunks=(1, c), dtype="float32", compressors=codec(), fill_value=np.nan)
            elif layout == "sharded":
                a = g.create_array("l", shape=(k, n), chunks=(1, c), shards=(64, c), dtype="float32", compressors=codec(), fill_value=np.nan)
            else:
                a = g.create_array("l", shape=(k, n), chunks=(k, c), dtype="float32", compressors=codec(), fill_value=np.nan)
            t = time.perf_counter()
            if layout == "blocks":
                a[...] = np.stack([rows[j % 4] for j in range(k)])
            else:
                for j in range(k):
                    a[j, :] = rows[j % 4]
            write = time.perf_counter() - t
            t = time.perf_counter()
            nblocks = 0
            for start in range(0, n, c):
                a[:, start : start + c]  # read (the time measured)
                nblocks += 1
            read = time.perf_counter() - t
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            out[layout] = {
                "append_MBps": round(mb / write, 1),
                "read_block_MBps": round(mb / read, 1),
                "files": sum(1 for f in path.rglob("*") if f.is_file()),
                "bytes_per_value": round(size / (n * k), 3),
            }
            shutil.rmtree(path)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
