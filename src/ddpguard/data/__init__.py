"""Data: JSONL datasets over memory-mapped offset indexes, and make_loader."""

from .index import DatasetError, StaleIndexError, cache_dir, candidate_paths
from .jsonl import (
    JsonlDataset,
    RecordError,
    build_lengths,
    build_offsets,
    length_key_name,
    resolve_paths,
)
from .loader import NoneSampleError, make_loader, strict_collate, worker_seed

__all__ = [
    "DatasetError",
    "JsonlDataset",
    "NoneSampleError",
    "RecordError",
    "StaleIndexError",
    "build_lengths",
    "build_offsets",
    "cache_dir",
    "candidate_paths",
    "length_key_name",
    "make_loader",
    "resolve_paths",
    "strict_collate",
    "worker_seed",
]
