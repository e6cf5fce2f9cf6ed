"""Small checkpoint folders for the offline-recording tests: tiny TinyGPTs, 8 probe sequences."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.probe import ProbeSet

CONFIG = GPTConfig(vocab_size=64, context=32, n_layer=1, n_head=2, n_embd=16)
SPEC = {"type": "tinygpt", "config": CONFIG.to_dict()}


def make_probe(n_sequences: int = 8, context: int = 32, vocab: int = 64, seed: int = 0) -> ProbeSet:
    rng = np.random.default_rng(seed)
    return ProbeSet.from_tokens(rng.integers(0, vocab, size=(n_sequences, context + 1)))


def make_model(seed: int, cfg: GPTConfig = CONFIG) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(cfg)


def direct_losses(model: torch.nn.Module, probe: ProbeSet) -> np.ndarray:
    """Per-token losses computed by hand (an independent path: log_softmax and gather)."""
    model.eval()
    t = torch.as_tensor(probe.tokens, dtype=torch.long)
    with torch.no_grad():
        out = model(t[:, :-1])
        logits = getattr(out, "logits", out).float()  # (S, C, V); HF models return .logits
        logp = torch.log_softmax(logits, dim=-1)
        nll = -logp.gather(-1, t[:, 1:, None])[..., 0]  # (S, C)
    return nll.reshape(-1).numpy()


def write_spec(folder: Path, spec: dict = SPEC) -> None:
    (folder / "tokdyn_model.json").write_text(json.dumps(spec))


def save_torch(model: torch.nn.Module, path: Path, *, wrap: str | None = None, prefix: str = "") -> None:
    sd = {prefix + k: v for k, v in model.state_dict().items()}
    torch.save(sd if wrap is None else {wrap: sd, "step": 1, "note": "wrapped"}, path)


def save_safetensors(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import save_model

    save_model(model, str(path))  # drops the tied head.weight duplicate


def mixed_folder(folder: Path, steps=(0, 10, 100, 1000)) -> dict[int, TinyGPT]:
    """A folder of .pt and .safetensors checkpoints with differently named steps; returns the models."""
    folder.mkdir(parents=True, exist_ok=True)
    write_spec(folder)
    names = ["step_{:06d}.pt", "ckpt-{}.safetensors", "model_{}.bin", "step{}.pth", "ckpt-{}.safetensors"]
    models = {}
    for j, step in enumerate(steps):
        m = make_model(seed=1000 + step)
        name = names[j % len(names)].format(step)
        (save_safetensors if name.endswith(".safetensors") else save_torch)(m, folder / name)
        models[step] = m
    return models


def hf_config(**kw):
    import transformers

    base = dict(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Config(**{**base, **kw})


def make_hf_model(seed: int):
    import transformers

    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(hf_config())
