"""Every GPU check in one short run (the device is lent by the minute; run this once).

1. record: the recorder on CUDA. A GPT of ~20M parameters trains with and without the recorder
   attached, and with the probe forwards alone; reports the per-record stall of the training
   step beyond the forwards, the training-thread time inside ``record()``, and the number of
   host syncs the recorder itself causes (torch's sync debug mode, counted during ``record``).
2. fit: the torch backend on CUDA, fits/s on planted events (100 log-spaced points, noise 0.2
   nats) for the sigmoid alone and for the full record; agreement with the CPU backend.

    python pipelines/gpu_check.py [--quick]

Prints one JSON line per check and writes them to $OUT/gpu_check.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

import tokdyn
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.record import TokenLossRecorder, token_losses


DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def check_record(quick: bool) -> dict:
    dev = torch.device(DEVICE)
    cfg = GPTConfig(vocab_size=257, context=256, n_layer=6, n_head=8, n_embd=512)
    steps = 60 if quick else 300
    n_probe = 256 if quick else 1024
    if DEVICE == "cpu":
        cfg = GPTConfig(vocab_size=257, context=32, n_layer=1, n_head=2, n_embd=32)
        steps, n_probe = 20, 16
    rng = np.random.default_rng(0)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 256, size=(n_probe, cfg.context + 1)))
    data = torch.randint(0, 256, (steps, 32, cfg.context + 1), generator=torch.Generator().manual_seed(0)).to(dev)
    schedule = tokdyn.geometric_schedule(steps, 30)

    def run(mode: str, store: str) -> tuple[float, dict]:
        torch.manual_seed(0)
        model = TinyGPT(cfg).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        info: dict = {}
        rec = TokenLossRecorder(model, probe, store, "r", schedule=schedule, batch_size=256) if mode == "recorder" else None
        probe_tokens = torch.as_tensor(probe.tokens, dtype=torch.long, device=dev)
        todo = set(schedule.tolist())
        sync()
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            batch = data[step - 1]
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if mode == "recorder":
                rec.maybe_record(step)
            elif mode == "forwards" and step in todo:
                token_losses(model, probe_tokens, batch_size=256)
        sync()
        dt = time.perf_counter() - t0
        if rec is not None:
            info["record_seconds"] = rec.record_seconds
            info["n_recorded"] = rec.n_recorded
            # Host syncs caused by record() itself: torch warns on each synchronizing call.
            extra = TokenLossRecorder(model, probe, store, "sync-probe", schedule=[0], batch_size=256)
            sync()
            if DEVICE == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                extra.record(0)
            if DEVICE == "cuda":
                torch.cuda.set_sync_debug_mode("default")
            extra.close()
            rec.close()
            info["host_syncs_in_record"] = sum("synchroniz" in str(w.message) for w in caught)
        return dt, info

    with tempfile.TemporaryDirectory() as d:
        run("plain", f"{d}/w.zarr")  # warm-up: kernels, allocator
        t_plain, _ = run("plain", f"{d}/a.zarr")
        t_fwd, _ = run("forwards", f"{d}/b.zarr")
        t_rec, info = run("recorder", f"{d}/c.zarr")
        rows = tokdyn.open_store(f"{d}/c.zarr", mode="r").run("r")
        ok_rows = rows.n_committed == len(schedule[schedule >= 1])
    n = info["n_recorded"]
    return {
        "check": "record_cuda",
        "gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (dry run)",
        "params": sum(p.numel() for p in TinyGPT(cfg).parameters()),
        "probe_tokens": probe.n_tokens,
        "steps": steps,
        "records": n,
        "plain_s": round(t_plain, 3),
        "forwards_s": round(t_fwd, 3),
        "recorder_s": round(t_rec, 3),
        "forward_ms_per_record": round((t_fwd - t_plain) / n * 1e3, 3),
        "stall_beyond_forwards_ms_per_record": round((t_rec - t_fwd) / n * 1e3, 3),
        "overhead_beyond_forwards_pct": round((t_rec - t_fwd) / t_plain * 100, 2),
        "record_call_host_ms": round(info["record_seconds"] / n * 1e3, 3),
        "host_syncs_in_record": info["host_syncs_in_record"],
        "rows_committed_ok": bool(ok_rows),
    }


def check_fit(quick: bool) -> dict:
    from tokdyn.fit import fit_sigmoids
    from tokdyn.fit.synthetic import plant_sigmoids

    x = np.linspace(1.0, 5.0, 100)
    n = 200_000 if quick else 2_000_000
    if DEVICE == "cpu":
        n = 2_000
    planted = plant_sigmoids(n, x, rng=np.random.default_rng(0), noise=0.2)
    Y = planted.Y
    out = {"check": "fit_cuda", "n": n, "points": len(x)}
    fit_sigmoids(x, Y[:20_000], backend="torch", device=DEVICE, two_step=False)  # warm-up
    sync()
    t = time.perf_counter()
    f = fit_sigmoids(x, Y, backend="torch", device=DEVICE, two_step=False, block_rows=1 << 20)
    sync()
    out["fits_per_s"] = round(n / (time.perf_counter() - t))
    out["mu_mae"] = float(np.median(np.abs(f.mu - planted.truth["mu"])))
    m = min(n, 200_000)
    t = time.perf_counter()
    fit_sigmoids(x, Y[:m], backend="torch", device=DEVICE, block_rows=1 << 20)
    sync()
    out["full_fits_per_s"] = round(m / (time.perf_counter() - t))
    # Agreement with the CPU backend on a subset: same optimum (relative SSE).
    k = min(n, 20_000)
    cpu = fit_sigmoids(x, Y[:k], two_step=False)
    gpu_sse, cpu_sse = f.sse[:k], cpu.sse
    ok = np.isfinite(gpu_sse) & np.isfinite(cpu_sse)
    out["cpu_backend"] = "numba/numpy"
    out["sse_agree_frac"] = float(np.mean(np.abs(gpu_sse[ok] - cpu_sse[ok]) <= 1e-6 * np.maximum(cpu_sse[ok], 1e-12)))
    out["mu_agree_frac_1e-4"] = float(np.mean(np.abs(f.mu[:k][ok] - cpu.mu[ok]) < 1e-4))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("record", "fit"))
    ap.add_argument("--dry-run-cpu", action="store_true", help="run the checks on the CPU, tiny, to test the script")
    args = ap.parse_args()
    global DEVICE
    if args.dry_run_cpu:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_check needs CUDA (or --dry-run-cpu)")
    results = []
    for name, fn in (("record", check_record), ("fit", check_fit)):
        if args.only and args.only != name:
            continue
        try:
            res = fn(args.quick)
        except Exception as exc:  # noqa: BLE001 - report and go on to the next check
            res = {"check": name, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(res), flush=True)
        results.append(res)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_check.json"), "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
