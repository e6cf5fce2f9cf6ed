"""Curriculum A/B v2: does reshaping the domain mixture by learnability speed training up?

    python pipelines/curriculum_ab.py --out curriculum-ab            # defaults: <= 15 min on 2 unloaded CPU cores
    python pipelines/curriculum_ab.py --out /tmp/ab --quick          # CI smoke test (well under a minute)
    python pipelines/curriculum_ab.py --out ab-gpu --device cuda --seeds $(seq 0 31) --workers 8 --steps 2000
    python pipelines/curriculum_ab.py --out ab-v1 --v1               # the first design (per-token weights)

On the standard library's mixture of domains (code, prose, decimal test vectors, certificates,
markup): a pilot (its compute reported apart), the mixture schedule's enrichment, then per seed
the uniform budget ladder (0.8x, 0.9x, 1.0x, fully annealed), an A/A arm and the curriculum arms,
all drawing coupled batches. Prints per arm the speed-up read off the ladder and the AUC ratio
with 95 % intervals over seeds (the t interval, widened where the bootstrap reaches further), the positive control and the A/A difference; writes
results.json and curves.png into --out (tokdyn.curriculum.ab).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from tokdyn._files import strict_json
from tokdyn.errors import TokdynError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="curriculum-ab", help="output folder (default: curriculum-ab)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI); other options still override")
    ap.add_argument("--v1", action="store_true", help="run the first design (tokdyn.curriculum.experiment) instead")
    ap.add_argument("--source", help="'stdlib-mix' (default), a folder of text (domain = sub-folder) or a .jsonl with a 'domain' field")
    ap.add_argument("--device", help="torch device (default cpu)")
    ap.add_argument("--seeds", type=int, nargs="+", help="training seeds (default 0..9)")
    ap.add_argument("--arms", nargs="+", help="arms: aa mixture reducible short_long mixture_hand")
    ap.add_argument("--ladder", type=float, nargs="+", help="baseline budgets (default 0.8 0.9 1.0)")
    for field in ("steps", "batch_size", "context", "n_layer", "n_head", "n_embd", "pilot_per_domain", "pilot_points",
                  "val_tokens", "eval_points", "workers", "threads", "aa_train_seeds", "max_train_tokens", "compare_seed"):  # fmt: skip
        ap.add_argument("--" + field.replace("_", "-"), type=int)
    for field in ("lr", "floor", "temperature", "width", "lead", "reducible_floor", "reducible_width", "context_start",
                  "pilot_share"):
        ap.add_argument("--" + field.replace("_", "-"), type=float)
    ap.add_argument("--pilot-probe", choices=("train", "heldout", "split"),
                    help="pilot probe windows: training documents held out from the pilot ('split', default), the training "
                         "windows the pilot trains on ('train'), or the validation documents ('heldout': leaks them into the schedule)")  # fmt: skip
    ap.add_argument("--no-compare", action="store_true", help="do not rerun a seed for tokdyn compare (on in --quick)")
    ap.add_argument("--reuse", help="a previous results.json whose baseline (ladder) runs match: they are not retrained")
    ap.add_argument("--contexts", type=int, nargs="+", help="short-to-long contexts (default 16 32 64)")
    ap.add_argument("--wide-width", type=float, help="with --v1: the width of the sample_wide and token_wide arms (default 0.6)")
    args = ap.parse_args()
    if args.v1:
        return _v1(args)
    if args.wide_width is not None:
        print("curriculum_ab: error: --wide-width is an option of the first design (--v1)", file=sys.stderr)
        return 1

    from tokdyn.curriculum.ab import MixtureABConfig, run_mixture_ab

    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("out", "quick", "v1", "no_compare", "wide_width")}
    if args.no_compare:
        given["compare_seed"] = None
    for k in ("seeds", "arms", "ladder", "contexts"):
        if k in given:
            given[k] = tuple(given[k])
    try:
        cfg = MixtureABConfig.quick(**given) if args.quick else MixtureABConfig(**given)
        res = run_mixture_ab(args.out, cfg)
    except TokdynError as exc:
        print(f"curriculum_ab: error: {exc}", file=sys.stderr)
        return 1
    except TypeError as exc:
        print(f"curriculum_ab: error: {exc}", file=sys.stderr)
        return 1
    head = {arm: {"speedup": c["speedup"], "auc_ratio": c["auc_ratio"]["mean"], "auc_ratio_ci95": c["auc_ratio"]["ci95"]}
            for arm, c in res["comparison"].items()}  # fmt: skip
    print(json.dumps(strict_json({"arms": head, "enrichment": res["enrichment"]["schedule"], "enrichment_best": res["enrichment"]["best"],
                      "positive_control": res["positive_control"], "aa": res["aa"], "total_seconds": res["total_seconds"],
                      "pilot_seconds": res["pilot"]["seconds"]}), default=str, allow_nan=False))  # fmt: skip
    return 0


def _v1(args) -> int:
    from tokdyn.curriculum.experiment import ABConfig, run_ab

    from tokdyn.curriculum.experiment import ARMS

    fields = {f.name for f in dataclasses.fields(ABConfig)}
    given = {k: v for k, v in vars(args).items() if v is not None and v is not False and k not in ("out", "quick", "v1")}
    other = ["--" + k.replace("_", "-") for k in given if k not in fields]  # dropped without a word, they were
    if other:
        print(f"curriculum_ab: error: {', '.join(other)} {'is not an option' if len(other) == 1 else 'are not options'} "
              f"of the first design (--v1)", file=sys.stderr)  # fmt: skip
        return 1
    if "arms" in given:
        unknown = [a for a in given["arms"] if a not in ARMS]
        if unknown:
            print(f"curriculum_ab: error: --v1 arms are {list(ARMS)}, got {unknown}", file=sys.stderr)
            return 1
        given["arms"] = tuple(dict.fromkeys(("baseline", *given["arms"])))
    if "seeds" in given:
        given["seeds"] = tuple(given["seeds"])
    try:
        cfg = ABConfig.quick(**given) if args.quick else ABConfig(**given)
        res = run_ab(args.out, cfg)
    except TokdynError as exc:
        print(f"curriculum_ab: error: {exc}", file=sys.stderr)
        return 1
    head = {arm: {"speedup_mean": c["speedup"]["mean"], "speedup_ci95": c["speedup"]["ci95"],
                  "auc_ratio_mean": c["auc_ratio"]["mean"], "auc_ratio_ci95": c["auc_ratio"]["ci95"],
                  "per_seed_speedup": c["per_seed"]["speedup"], "not_reached": c["not_reached"]}
            for arm, c in res["comparison"].items()}  # fmt: skip
    v = res["pilot"]["validation"] or {}
    print(json.dumps(strict_json({"arms": head, "mu_spearman": v.get("mu_spearman"), "delta_spearman": v.get("delta_spearman"),
                      "total_seconds": res["total_seconds"]}), allow_nan=False))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
