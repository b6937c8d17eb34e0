"""Count-based byte models of the demo's text, fitted on the training file and scored on the
evaluation file: the bars a learned model has to clear to show it learned more than byte
frequencies (unigram) and one byte of context (bigram).

They score exactly what the demo's model is scored on (`net.lm_loss`): every byte of a record
but its first, from the bytes before it, in nats per predicted byte.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["Baselines", "byte_baselines"]

# Dirichlet smoothing strengths tried for the bigram (pseudo-counts spread like the unigram).
# The best one is chosen on the evaluation file itself: that makes the bigram's bar as high as
# this family of models can set it, never lowered by a badly chosen constant.
_BIGRAM_PRIORS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
MAX_BYTES = 256  # the model sees at most this many bytes of a record (net.collate)


@dataclasses.dataclass(frozen=True)
class Baselines:
    unigram: float  # nats per predicted byte on the evaluation file
    bigram: float
    bigram_prior: float  # the smoothing that gave `bigram`
    eval_bytes: int  # predicted bytes scored


def _records(path: Path) -> Iterator[bytes]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield str(json.loads(line)["text"]).encode()[:MAX_BYTES]


def _pair_counts(path: Path) -> np.ndarray:
    """counts[a, b]: byte b right after byte a, within records (as the model predicts)."""
    counts = np.zeros((256, 256), dtype=np.float64)
    for raw in _records(path):
        if len(raw) < 2:
            continue
        arr = np.frombuffer(raw, dtype=np.uint8)
        np.add.at(counts, (arr[:-1], arr[1:]), 1.0)
    return counts


def byte_baselines(train: Path, val: Path) -> Baselines:
    """Unigram (add-one) and Dirichlet-smoothed bigram fitted on `train`, scored on `val`."""
    fit, test = _pair_counts(train), _pair_counts(val)
    n_eval = int(test.sum())
    if n_eval == 0:
        raise ValueError(f"{val} has no record of 2 bytes or more to score")
    # Targets only: the first byte of a record is never predicted, so it is not counted.
    uni = (fit.sum(0) + 1.0) / (fit.sum() + 256.0)
    unigram = float(-(test.sum(0) * np.log(uni)).sum() / n_eval)
    best = (math.inf, 0.0)
    row = fit.sum(1, keepdims=True)
    for prior in _BIGRAM_PRIORS:
        cond = (fit + prior * uni[None, :]) / (row + prior)
        nll = float(-(test * np.log(cond)).sum() / n_eval)
        best = min(best, (nll, prior))
    return Baselines(unigram=unigram, bigram=best[0], bigram_prior=best[1], eval_bytes=n_eval)
