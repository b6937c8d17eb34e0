"""A tiny causal transformer over bytes (vocabulary 256 plus a padding id)."""

from __future__ import annotations

import torch
from torch import nn

PAD = 256
VOCAB = 257


class ByteLM(nn.Module):
    def __init__(self, d_model: int = 96, n_layers: int = 2, n_heads: int = 4,
                 max_len: int = 256, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)
        self.max_len = max_len

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.embed(tokens) + self.pos(pos)[None]
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
