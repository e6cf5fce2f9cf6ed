"""Train the tiny GPT on the embedded standard-library corpus with the recorder attached.

    python pipelines/train_tiny.py --out runs.zarr --run tiny --steps 800
    python pipelines/train_tiny.py --out runs.zarr --run tiny-cuda --device cuda --steps 5000 --n-layer 6 --n-embd 256

Writes one run (axis T) into the store and prints a JSON summary line.
"""

from __future__ import annotations

import argparse
import json

from tokdyn.data import prepare_corpus
from tokdyn.model import GPTConfig
from tokdyn.train import TrainConfig, record_tiny_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="store path or URL (created if missing)")
    ap.add_argument("--run", default="tiny")
    ap.add_argument("--source", default="stdlib", help="'stdlib', a text folder/file, .jsonl or .bin")
    ap.add_argument("--tokenizer", default="byte", help="'byte', 'bpe' (trained on the training side) or a tokenizer.json")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--probe-sequences", type=int, default=128)
    ap.add_argument("--points", type=int, default=40, help="log-spaced recording points")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="continue an existing run (skips recorded steps)")
    args = ap.parse_args()

    corpus = prepare_corpus(args.source, tokenizer=args.tokenizer, context=args.context,
                            n_probe_sequences=args.probe_sequences, seed=args.seed)  # fmt: skip
    mcfg = GPTConfig(vocab_size=corpus.tokenizer.vocab_size, context=args.context,
                     n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd)  # fmt: skip
    tcfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    stats = record_tiny_run(args.out, run=args.run, corpus=corpus, model_config=mcfg, train_config=tcfg,
                            n_points=args.points, dtype=args.dtype, device=args.device, resume=args.resume)  # fmt: skip
    print(json.dumps({k: v for k, v in stats.items() if k not in ("train_config",)}))


if __name__ == "__main__":
    main()
