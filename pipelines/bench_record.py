"""Benchmark the recorder: its cost beyond the probe forwards, write throughput, bytes per value.

Trains the tiny GPT three ways in one process, interleaved over ``--repeats`` rounds so that
machine noise hits all three alike:

  plain     the training loop alone
  recorder  the same loop with TokenLossRecorder attached (probe forwards + writer thread)
  forwards  the same loop calling only the probe forwards at the scheduled steps

overhead_pct = (median(recorder) - median(forwards)) / median(plain) * 100: what recording costs
beyond the forwards it must do. Then it times RunWriter.append on large rows (logical MB/s of
float32 losses) and measures stored bytes per loss value for float32 and float16 on the losses
the recorder wrote. Prints one JSON line.

    python pipelines/bench_record.py            # the figures in docs/benchmarks.md
    python pipelines/bench_record.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import tokdyn
from tokdyn.data import prepare_corpus, random_batches
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.record import TokenLossRecorder, token_losses
from tokdyn.train import TrainConfig, train


def one_run(mode: str, corpus, cfg: TrainConfig, schedule, store_url: str, run: str, dtype: str) -> float:
    torch.manual_seed(cfg.seed)
    model = TinyGPT(GPTConfig(vocab_size=corpus.tokenizer.vocab_size, context=corpus.probe.context, n_layer=4))
    batches = random_batches(corpus.train_tokens, batch_size=cfg.batch_size, context=corpus.probe.context, seed=cfg.seed)
    t0 = time.perf_counter()
    if mode == "plain":
        train(model, batches, cfg)
    elif mode == "recorder":
        with TokenLossRecorder(model, corpus.probe, store_url, run, schedule=schedule, dtype=dtype) as rec:
            train(model, batches, cfg, recorder=rec)
    elif mode == "forwards":
        probe_tokens = torch.as_tensor(corpus.probe.tokens, dtype=torch.long)
        todo = set(schedule.tolist())

        def on_step(step, loss):
            if step in todo:
                token_losses(model, probe_tokens)

        if 0 in todo:
            token_losses(model, probe_tokens)
        train(model, batches, cfg, on_step=on_step)
    else:
        raise ValueError(mode)
    return time.perf_counter() - t0


def write_throughput(tmp: Path, n_tokens: int, rows: int) -> float:
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n_tokens, dtype=np.int32), "token_pos": np.ones(n_tokens, np.int32)})
    st = tokdyn.open_store(tmp / "w.zarr", probe, mode="w")
    w = st.create_run("w", capacity=rows).writer()
    rng = np.random.default_rng(0)
    data = [rng.gamma(2.0, 1.5, n_tokens).astype(np.float32) for _ in range(4)]
    t0 = time.perf_counter()
    for k in range(rows):
        w.append(data[k % 4], step=k)
    dt = time.perf_counter() - t0
    return rows * n_tokens * 4 / dt / 1e6


def loss_bytes(store_url: str, run: str) -> tuple[float, int]:
    r = tokdyn.open_store(store_url, mode="r").run(run)
    root = Path(store_url) / "runs" / run / "loss"
    nbytes = sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and f.name != "zarr.json")
    n_values = r.n_committed * r.n_tokens
    return nbytes / n_values, n_values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--points", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write-tokens", type=int, default=2_000_000, help="tokens per row in the write test")
    ap.add_argument("--write-rows", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.points, args.repeats, args.write_tokens, args.write_rows = 30, 8, 1, 100_000, 4

    corpus = prepare_corpus(context=128, n_probe_sequences=128)
    cfg = TrainConfig(steps=args.steps)
    schedule = tokdyn.geometric_schedule(args.steps, args.points)
    times: dict[str, list[float]] = {"plain": [], "recorder": [], "forwards": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(args.repeats):
            for mode in ("plain", "recorder", "forwards"):
                url = str(tmp / f"{mode}{rep}.zarr")
                times[mode].append(one_run(mode, corpus, cfg, schedule, url, "r", "float32"))
        med = {k: statistics.median(v) for k, v in times.items()}
        # Bytes per value on real recorded losses, float32 and float16.
        bpv32, n_values = loss_bytes(str(tmp / "recorder0.zarr"), "r")
        losses = tokdyn.open_store(tmp / "recorder0.zarr", mode="r").run("r").losses()
        st16 = tokdyn.open_store(tmp / "h.zarr", corpus.probe, mode="w")
        w16 = st16.create_run("r", dtype="float16", capacity=len(losses)).writer()
        for k, row in enumerate(losses):
            w16.append(row, step=k)
        bpv16, _ = loss_bytes(str(tmp / "h.zarr"), "r")
        mbps = write_throughput(tmp, args.write_tokens, args.write_rows)
    print(json.dumps({
        "steps": args.steps, "recorded_rows": len(schedule), "probe_tokens": corpus.probe.n_tokens,
        "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
        "plain_s": round(med["plain"], 3), "recorder_s": round(med["recorder"], 3), "forwards_s": round(med["forwards"], 3),
        "forwards_pct_of_training": round((med["forwards"] - med["plain"]) / med["plain"] * 100, 2),
        "overhead_pct": round((med["recorder"] - med["forwards"]) / med["plain"] * 100, 2),
        "noise_pct": round((max(times["plain"]) - min(times["plain"])) / med["plain"] * 100, 2),
        "write_MBps": round(mbps, 1), "write_tokens_per_row": args.write_tokens,
        "bytes_per_value_float32": round(bpv32, 3), "bytes_per_value_float16": round(bpv16, 3),
        "values_measured": n_values,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
