"""Samplers that keep every rank in step (layer: sampling -> world).

EvenSampler: same count on every rank, O(1)-memory Feistel shuffle, self-advancing epoch,
resume by global position on any world size. DistributedSampler: the same with
torch's constructor, counts and padding (a one-line drop-in). TokenBatchSampler:
token-budget batches with an equal batch count per rank and no duplicated samples.
"""

from .distributed import DistributedSampler
from .even import EvenSampler
from .permutation import feistel_keys, permute
from .plan import (
    epoch_end,
    is_padding_position,
    num_real_for_rank,
    per_rank_count,
    positions_to_indices,
    rank_indices,
    rank_positions,
)
from .tokens import TokenBatchSampler, TokenPlan, check_lengths, plan_token_batches

__all__ = [
    "DistributedSampler",
    "EvenSampler",
    "TokenBatchSampler",
    "TokenPlan",
    "check_lengths",
    "epoch_end",
    "feistel_keys",
    "is_padding_position",
    "num_real_for_rank",
    "per_rank_count",
    "permute",
    "plan_token_batches",
    "positions_to_indices",
    "rank_indices",
    "rank_positions",
]
