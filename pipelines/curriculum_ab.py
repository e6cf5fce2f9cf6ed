"""Curriculum A/B: does reweighting training by when tokens become learnable speed it up?

    python pipelines/curriculum_ab.py --out curriculum-ab            # defaults: 7-9 min on 2 CPU cores
    python pipelines/curriculum_ab.py --out /tmp/ab --quick          # seconds: a smoke test
    python pipelines/curriculum_ab.py --out ab-gpu --device cuda --steps 3000 --n-layer 6 --n-embd 256 --batch-size 64

A pilot run (tokens drawn from the training pool, recorded and fitted), its learnability table,
then a uniform baseline and the curriculum arms (sample weights, token weights, two kernel
widths) over several seeds with the same token budget. Writes pilot.zarr, learnability.npz,
results.json and curves.png into --out and prints one JSON line of the headline figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from tokdyn.curriculum.experiment import ARMS, ABConfig, run_ab
from tokdyn.curriculum.learnability import LearnabilityOptions
from tokdyn.errors import TokdynError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="curriculum-ab", help="output folder (default: curriculum-ab)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (tests); other options still override")
    ap.add_argument("--device", help="torch device (default cpu)")
    ap.add_argument("--seeds", type=int, nargs="+", help="training seeds (default 0 1 2)")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), help="arms to run (baseline always included)")
    for field in ("steps", "batch_size", "context", "n_layer", "n_head", "n_embd", "pilot_steps", "pilot_sequences",
                  "pilot_points", "eval_points", "val_sequences"):  # fmt: skip
        ap.add_argument("--" + field.replace("_", "-"), type=int)
    for field in ("lr", "width", "wide_width", "floor", "temperature", "lead"):
        ap.add_argument("--" + field.replace("_", "-"), type=float)
    ap.add_argument("--kernel", choices=("logistic", "gaussian"))
    ap.add_argument("--min-count", type=int, help="learnability: least count of a key of order >= 2")
    args = ap.parse_args()

    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("out", "quick", "min_count")}
    if "seeds" in given:
        given["seeds"] = tuple(given["seeds"])
    if "arms" in given:
        given["arms"] = tuple(dict.fromkeys(("baseline", *given["arms"])))
    try:
        cfg = ABConfig.quick(**given) if args.quick else ABConfig(**given)
        if args.min_count is not None:
            cfg = dataclasses.replace(cfg, learnability=dataclasses.replace(cfg.learnability, min_count=args.min_count))
        res = run_ab(args.out, cfg)
    except TokdynError as exc:
        print(f"curriculum_ab: error: {exc}", file=sys.stderr)
        return 1
    head = {arm: {"speedup_mean": c["speedup"]["mean"], "speedup_ci95": c["speedup"]["ci95"],
                  "auc_ratio_mean": c["auc_ratio"]["mean"], "auc_ratio_ci95": c["auc_ratio"]["ci95"],
                  "per_seed_speedup": c["per_seed"]["speedup"], "not_reached": c["not_reached"]}
            for arm, c in res["comparison"].items()}  # fmt: skip
    v = res["pilot"]["validation"] or {}
    print(json.dumps({"arms": head, "mu_spearman": v.get("mu_spearman"), "delta_spearman": v.get("delta_spearman"),
                      "total_seconds": res["total_seconds"]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
