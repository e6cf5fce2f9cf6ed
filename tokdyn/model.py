"""A tiny GPT (nanoGPT-style) for the pipelines, the demo and the tests.

A few hundred thousand to a few million parameters: small enough to train on 2 CPU cores in
minutes, large enough to show stepwise token learning on the standard-library corpus.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import InputError
from .runtime import count_parameters, register_model_builder

__all__ = ["GPTConfig", "TinyGPT", "count_parameters", "build_tinygpt"]  # count_parameters: from tokdyn.runtime


MAX_DIMENSION = 1 << 24  # any size of a tiny GPT (16 M tokens of vocabulary or context, layers, width)
MAX_PARAMETERS = 10**10  # 40 GB of float32: a config beyond it is a typo, refused before allocating


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 257
    context: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0

    def __post_init__(self) -> None:
        # Checked by type before by value: a config comes from JSON files a user wrote, where
        # "abc", null, 16.5 or true would otherwise fail deep in torch, or pass as 16 or 1.
        for name in ("vocab_size", "context", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_DIMENSION:
                raise InputError(f"GPTConfig.{name} must be an integer in [1, {MAX_DIMENSION}], got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.n_embd % self.n_head:
            raise InputError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        number = isinstance(self.dropout, (int, float, np.floating, np.integer)) and not isinstance(self.dropout, bool)
        if not number or not 0.0 <= self.dropout < 1.0:
            raise InputError(f"GPTConfig.dropout must be a number in [0, 1), got {self.dropout!r}")
        object.__setattr__(self, "dropout", float(self.dropout))
        n_params = self.vocab_size * self.n_embd + self.context * self.n_embd + self.n_layer * 12 * self.n_embd**2
        if n_params > MAX_PARAMETERS:
            raise InputError(f"GPTConfig {self.to_dict()} has about {n_params:.2g} parameters; a tiny GPT has at most {MAX_PARAMETERS:.0g}")

    def to_dict(self) -> dict:
        return asdict(self)


class _Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer: ``forward(idx [B, T]) -> logits [B, T, vocab]``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.context, cfg.n_embd)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying, as in GPT-2
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (the name Hugging Face models use): its size is the vocabulary."""
        return self.tok_emb

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T > self.config.context:
            raise InputError(f"sequence length {T} exceeds the model context {self.config.context}")
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, V)


def build_tinygpt(config: dict) -> TinyGPT:
    """A freshly initialised TinyGPT from ``GPTConfig`` fields: the ``"tinygpt"`` model kind that
    rebuilds saved checkpoints (``{"type": "tinygpt", "config": {...}}``)."""
    names = {f.name for f in fields(GPTConfig)}
    if unknown := set(config) - names:
        raise InputError(f"unknown GPTConfig fields {sorted(unknown)}; expected some of {sorted(names)}")
    return TinyGPT(GPTConfig(**config))


register_model_builder("tinygpt", build_tinygpt)
