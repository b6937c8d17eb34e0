"""A small causal transformer over bytes (vocabulary 256 plus a padding id)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

PAD = 256
VOCAB = 257


class ByteLM(nn.Module):
    """Pre-norm transformer; the output layer shares the embedding's weights (fewer parameters
    to learn from a minute of data). `context` > 1 adds a causal convolution over the last
    `context` bytes' embeddings before the first block: the model sees short n-grams from its
    first step instead of having to learn attention for them first (docs/demo.md: this is
    what gets it past the bigram's loss within a minute)."""

    def __init__(self, d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                 max_len: int = 256, dropout: float = 0.0, batch_norm: bool = False,
                 context: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        self.embed = nn.Embedding(VOCAB, d_model, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.max_len = max_len
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.scale = math.sqrt(d_model)
        # Only for `ddpguard demo --hang bn-eval`: running statistics are buffers, which DDP
        # broadcasts from rank 0 at the start of every forward through the wrapper.
        self.bn = nn.BatchNorm1d(d_model) if batch_norm else None
        if context < 1:
            raise ValueError(f"context={context} must be >= 1 (1: no convolution)")
        self.context = context
        self.conv = nn.Conv1d(d_model, d_model, context) if context > 1 else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.embed(tokens) * self.scale + self.pos(pos)[None]
        if self.bn is not None:
            x = self.bn(x.transpose(1, 2)).transpose(1, 2)
        if self.conv is not None:  # left padding only: position t sees bytes t-context+1..t
            h = nn.functional.pad(x.transpose(1, 2), (self.context - 1, 0))
            x = x + self.conv(h).transpose(1, 2)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        x = self.blocks(x, mask=mask, is_causal=True)
        return self.head(self.norm(x))


def collate(records: list[dict[str, object]]) -> torch.Tensor:
    """Byte sequences padded to the longest in the batch (token batching keeps that small)."""
    seqs = [str(r["text"]).encode()[:256] for r in records]
    width = max((len(s) for s in seqs), default=1)
    out = torch.full((len(seqs), width), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
    return out


def lm_loss(model: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence summed next-byte loss and predicted-byte counts (for a per-token mean)."""
    if tokens.shape[0] == 0:
        z = tokens.new_zeros(0, dtype=torch.float32)
        return z, z
    logits = model(tokens[:, :-1])
    target = tokens[:, 1:]
    loss = nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=PAD,
                                       reduction="none")
    valid = (target != PAD).float()
    return (loss * valid).sum(1), valid.sum(1)


def warmup_cosine(total_steps: int, warmup: int, floor: float = 0.1) -> Callable[[int], float]:
    """LambdaLR factor: linear warm-up over `warmup` steps, then a cosine down to `floor` of
    the peak at `total_steps` (and `floor` after)."""
    if total_steps < 1 or warmup < 0:
        raise ValueError(f"total_steps={total_steps} must be >= 1 and warmup={warmup} >= 0")

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * done))

    return factor
