"""Benchmark the recorder: its cost beyond the probe forwards, write throughput, bytes per value.

Trains the tiny GPT three ways in one process, interleaved over ``--repeats`` rounds (the order
rotating from round to round) so that machine noise hits all three alike:

  plain     the training loop alone
  recorder  the same loop with TokenLossRecorder attached (probe forwards + writer thread)
  forwards  the same loop calling only the probe forwards at the scheduled steps

overhead_pct = (median(recorder) - median(forwards)) / median(plain) * 100: what recording costs
beyond the forwards it must do; writer_cpu_* is the CPU the writer's and zarr's threads spend on
a replay of the schedule at the plain run's pace (see writer_cpu); overhead_by_round_pct is the same figure round by round (its
spread is the noise on it), and overhead_cpu_pct the same from the process's CPU time (user +
system), which other jobs on the machine disturb less than wall time.

overhead_accounted_pct adds up what recording does beyond the forwards, so machine noise does not
enter it: the training thread's time in the recorder's own code (the hook on every step, the
host copy and queueing of a recorded row: ``record_seconds - forward_seconds + hook_seconds`` of
the recorder runs, median) plus the writer's CPU (writer_cpu), over the plain run's time. On a
machine whose cores the training keeps busy, the writer can take no more from training than
the CPU it uses, so this bounds the overhead from above, cache effects aside; the wall-time
figures check it where the noise allows. ``--compare-commit-every S``
adds a fourth interleaved mode, the recorder with ``commit_every=S`` (0: each row written on its
own, as before rows were committed together), reported as ``overhead_compare_pct``. Then it times RunWriter.append on large rows (logical MB/s of
float32 losses) and measures stored bytes per loss value for float32 and float16 on the losses
the recorder wrote. Prints one JSON line.

    python pipelines/bench_record.py            # the figures in docs/benchmarks.md
    python pipelines/bench_record.py --quick    # a smoke run
    python pipelines/bench_record.py --compare-commit-every 0   # with the row-by-row writer beside it
    python pipelines/bench_record.py --presence-check   # steps with and without an idle recorder open
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
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


def _model(corpus) -> TinyGPT:
    """The benchmark's model: the tiny GPT with 4 layers, on the corpus's vocabulary and context."""
    return TinyGPT(GPTConfig(vocab_size=corpus.tokenizer.vocab_size, context=corpus.probe.context, n_layer=4))


def one_run(mode: str, corpus, cfg: TrainConfig, schedule, store_url: str, run: str, dtype: str,
            commit_every: float | None = None) -> tuple[float, float, float]:
    """(wall seconds, process CPU seconds, training-thread seconds in the recorder's own code
    beyond the forwards: 0 outside mode ``recorder``) of one training run in ``mode``."""
    torch.manual_seed(cfg.seed)
    model = _model(corpus)
    batches = random_batches(corpus.train_tokens, batch_size=cfg.batch_size, context=corpus.probe.context, seed=cfg.seed)
    t0, c0 = time.perf_counter(), _cpu()
    own = 0.0
    if mode == "plain":
        train(model, batches, cfg)
    elif mode == "recorder":
        kw = {} if commit_every is None else {"commit_every": commit_every}
        with TokenLossRecorder(model, corpus.probe, store_url, run, schedule=schedule, dtype=dtype, **kw) as rec:
            train(model, batches, cfg, recorder=rec)
        own = rec.record_seconds - rec.forward_seconds + rec.hook_seconds
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
    return time.perf_counter() - t0, _cpu() - c0, own


def writer_cpu(corpus, schedule, steps: int, step_s: float, store_url: str, commit_every: float | None) -> float:
    """CPU seconds spent outside the training thread (the writer's and zarr's threads) while the
    recorder records ``schedule`` on a replayed loop: ``step_s`` of sleep stands for each training
    step, and the probe forwards run for real on one torch thread (the training thread's own
    CPU). Unlike the wall-time overhead this barely moves with other jobs on the machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the forwards' CPU stays in this thread, out of the writer's count
    try:
        model = _model(corpus)
        kw = {} if commit_every is None else {"commit_every": commit_every}
        c0, m0 = _cpu(), time.thread_time()
        with TokenLossRecorder(model, corpus.probe, store_url, "r", schedule=schedule, **kw) as rec:
            for step in range(steps + 1):
                rec.maybe_record(step)
                time.sleep(step_s)
        return (_cpu() - c0) - (time.thread_time() - m0)
    finally:
        torch.set_num_threads(threads)


def presence_check(corpus, rounds: int = 4, steps: int = 25) -> dict:
    """Median training-step time (ms) with no recorder, and with a recorder open and idle (one row
    written, so its writer thread and zarr's threads exist), alternated ``rounds`` times in one
    process. Whether the recorder's mere presence slows the steps between its rows."""
    torch.manual_seed(0)
    model = _model(corpus)
    batches = random_batches(corpus.train_tokens, batch_size=32, context=corpus.probe.context, seed=0)

    def step_ms(n: int) -> float:  # the median time between the ends of n steps of train()
        ends: list[float] = []
        train(model, batches, TrainConfig(steps=n + 1), on_step=lambda step, loss: ends.append(time.perf_counter()))
        return float(np.median(np.diff(ends))) * 1e3

    step_ms(5)
    out: dict[str, list[float]] = {"no_recorder_ms": [], "idle_recorder_ms": []}
    with tempfile.TemporaryDirectory() as d:
        for k in range(rounds):
            out["no_recorder_ms"].append(step_ms(steps))
            with TokenLossRecorder(model, corpus.probe, f"{d}/p{k}.zarr", "r", schedule=[0, 1]) as rec:
                rec.record(0)
                rec.flush()
                out["idle_recorder_ms"].append(step_ms(steps))
    return {k: round(statistics.median(v), 2) for k, v in out.items()} | {"presence_rounds": rounds}


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


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
    ap.add_argument("--commit-every", type=float, default=None, help="the recorder's commit_every (default: its default)")
    ap.add_argument("--compare-commit-every", type=float, default=None,
                    help="also run the recorder with this commit_every, interleaved (0: row by row)")
    ap.add_argument("--presence-check", action="store_true",
                    help="only time training steps with and without an idle recorder open (presence_check)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.points, args.repeats, args.write_tokens, args.write_rows = 30, 8, 1, 100_000, 4

    corpus = prepare_corpus(context=128, n_probe_sequences=128)
    if args.presence_check:
        print(json.dumps(presence_check(corpus, rounds=2 if args.quick else 4, steps=5 if args.quick else 25)))
        return
    cfg = TrainConfig(steps=args.steps)
    schedule = tokdyn.geometric_schedule(args.steps, args.points)
    modes = ["plain", "recorder", "forwards"] + (["compare"] if args.compare_commit_every is not None else [])
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    own: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(args.repeats):
            # the order rotates round by round, so a drift of the machine's speed within a round
            # (other jobs, clock boost) does not always fall on the same mode
            for mode in modes[rep % len(modes):] + modes[: rep % len(modes)]:
                url = str(tmp / f"{mode}{rep}.zarr")
                every = args.compare_commit_every if mode == "compare" else args.commit_every
                wall, used, mine = one_run("recorder" if mode == "compare" else mode, corpus, cfg, schedule, url, "r", "float32", every)
                times[mode].append(wall)
                cpu[mode].append(used)
                own[mode].append(mine)
                print(f"round {rep}: {mode} {wall:.2f} s wall, {used:.2f} s CPU", file=sys.stderr, flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        # The writer's CPU on a replayed loop at this run's pace (plain seconds per step).
        step_s = med["plain"] / args.steps
        wcpu = {m: writer_cpu(corpus, schedule, args.steps, step_s, str(tmp / f"cpu-{m}.zarr"),
                              args.compare_commit_every if m == "compare" else args.commit_every)
                for m in ("recorder", "compare") if m in modes}  # fmt: skip
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
        "overhead_by_round_pct": [round((r - f) / p * 100, 2) for p, r, f in zip(times["plain"], times["recorder"], times["forwards"])],
        "overhead_cpu_pct": round((cmed["recorder"] - cmed["forwards"]) / cmed["plain"] * 100, 2),
        "commit_every": args.commit_every,
        "writer_cpu_ms_per_row": round(wcpu["recorder"] / len(schedule) * 1e3, 2),
        "writer_cpu_pct_of_training": round(wcpu["recorder"] / med["plain"] * 100, 2),
        "training_thread_ms_per_row": round(statistics.median(own["recorder"]) / len(schedule) * 1e3, 3),
        "overhead_accounted_pct": round((statistics.median(own["recorder"]) + wcpu["recorder"]) / med["plain"] * 100, 2),
        **({"compare_commit_every": args.compare_commit_every, "compare_s": round(med["compare"], 3),
            "overhead_compare_pct": round((med["compare"] - med["forwards"]) / med["plain"] * 100, 2),
            "overhead_compare_by_round_pct": [round((c - f) / p * 100, 2) for p, c, f in zip(times["plain"], times["compare"], times["forwards"])],
            "overhead_compare_cpu_pct": round((cmed["compare"] - cmed["forwards"]) / cmed["plain"] * 100, 2),
            "writer_cpu_compare_ms_per_row": round(wcpu["compare"] / len(schedule) * 1e3, 2),
            "writer_cpu_compare_pct_of_training": round(wcpu["compare"] / med["plain"] * 100, 2)}
           if "compare" in modes else {}),
        "noise_pct": round((max(times["plain"]) - min(times["plain"])) / med["plain"] * 100, 2),
        "write_MBps": round(mbps, 1), "write_tokens_per_row": args.write_tokens,
        "bytes_per_value_float32": round(bpv32, 3), "bytes_per_value_float16": round(bpv16, 3),
        "values_measured": n_values,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
