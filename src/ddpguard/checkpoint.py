"""Atomic rank-0 checkpoints that every rank can resume from, mid-epoch included.

Rank 0 writes to a temporary file in the same folder, flushes, fsyncs, renames over the target
and fsyncs the folder: a kill at any moment leaves either the previous checkpoint or the new one,
never half a file under the real name. The temporary name carries the writer's host, pid
namespace, pid and process start time, so the next save can remove what killed writers left
behind (`clean_stale_temps`) without touching a file that a live writer may still be writing.
The other ranks wait on a barrier bounded by `timeout`
(gloo's monitored_barrier names the ranks that never arrived). Everything saved loads with
`torch.load(weights_only=True)`: tensors, numbers, strings, lists and dicts only.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .checkpoint_temp import DEFAULT_STALE_AFTER, clean_stale_temps, temp_path
from .model import unwrap
from .world import World

__all__ = [
    "CheckpointError",
    "DEFAULT_STALE_AFTER",
    "clean_stale_temps",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "rng_state",
    "set_rng_state",
]

FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d{8,})\.pt$")
log = logging.getLogger("ddpguard")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which file and what to do."""


# ---------------------------------------------------------------------------------------------
# RNG state as weights_only-loadable values


def rng_state() -> dict[str, Any]:
    """This process's torch/CUDA/numpy/python RNG states as tensors, ints, strings and lists."""
    np_state = cast(tuple[Any, ...], np.random.get_state(legacy=True))
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        # Only where this process already uses CUDA: asking a CPU job on a GPU machine would
        # start CUDA in it for nothing (and fail in a process forked after CUDA started).
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": [str(np_state[0]), torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [int(py_version), list(py_internal), py_gauss],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") and torch.cuda.is_available():
        cuda = list(state["cuda"])[: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


# ---------------------------------------------------------------------------------------------
# files


def list_checkpoints(folder: str | os.PathLike[str]) -> list[Path]:
    """Checkpoints written by `save_checkpoint` into `folder`, oldest first."""
    d = Path(folder)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    found = list_checkpoints(folder)
    return found[-1] if found else None


def _target(path: Path, step: int) -> tuple[Path, bool]:
    """(file to write, whether `path` is a folder of numbered checkpoints)."""
    if path.suffix in (".pt", ".pth", ".ckpt"):
        return path, False
    return path / f"ckpt-{step:08d}.pt", True


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some filesystems (and Windows) cannot open a folder; rename is done anyway
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(state: dict[str, Any], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(target)
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def _bounded_barrier(world: World, timeout: float) -> None:
    if not world.distributed:
        return
    if dist.get_backend() == "gloo":
        dist.monitored_barrier(timeout=timedelta(seconds=timeout), wait_all_ranks=True)
    else:  # NCCL has no monitored barrier; the process-group timeout bounds this one
        dist.barrier()


def _gather_rng(world: World) -> list[dict[str, Any]]:
    mine = rng_state()
    if not world.distributed:
        return [mine]
    everyone: list[Any] = [None] * world.world_size
    dist.all_gather_object(everyone, mine)
    return everyone


def _prune(folder: Path, keep_last: int | None) -> None:
    if keep_last is not None:
        for old in list_checkpoints(folder)[:-keep_last]:
            old.unlink(missing_ok=True)


def _write_main(state: dict[str, Any], target: Path, keep_last: int | None,
                stale_after: float | None) -> str:
    """Rank 0's part; returns an error message instead of raising so every rank hears of it."""
    try:
        # First, so the space dead writers held is free before this file needs it.
        count, size = clean_stale_temps(target.parent, stale_after=stale_after)
        if count:
            log.warning("removed %d temporary checkpoint file(s) (%.1f MB) left in %s by "
                        "writers that died", count, size / 1e6, target.parent)
        # Pruning runs before the write too: a writer killed between its rename and its prune
        # left keep_last + 1 checkpoints, which plus this temp file would be one too many.
        _prune(target.parent, keep_last)
        _write_atomic(state, target)
        _prune(target.parent, keep_last)
    except OSError as exc:
        return (
            f"rank 0 could not write checkpoint {target}: {exc.strerror or exc}. Check that "
            "the folder exists, is writable by this user and has free space, or pass another "
            "checkpoint folder. The previous checkpoint, if any, is untouched."
        )
    except Exception as exc:  # e.g. an object torch cannot save: still tell every rank
        return f"rank 0 could not write checkpoint {target}: {exc!r}"
    return ""


def save_checkpoint(
    path: str | os.PathLike[str],
    world: World,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    sampler_state: dict[str, Any] | None = None,
    epoch: int = 0,
    step: int = 0,
    extra: dict[str, Any] | None = None,
    keep_last: int | None = None,
    timeout: float = 300.0,
    stale_after: float | None = DEFAULT_STALE_AFTER,
) -> Path:
    """Save on rank 0, atomically; every rank calls it and gets the written path back.

    `path` is a folder (files `ckpt-<step>.pt`, the newest `keep_last` kept) or a file ending in
    .pt/.pth/.ckpt. `sampler_state` is the sampler's `state_dict(consumed=...)` taken with the
    number of samples (or batches) this rank has actually consumed, so a resume neither skips nor
    repeats what the DataLoader had prefetched. All ranks' RNG states are gathered and saved.
    Temporary files that killed writers left in the folder are removed first and reported in
    one log line (see `clean_stale_temps`; `stale_after` seconds bounds the wait for writers
    on other nodes, None never removes those by age).
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    if stale_after is not None and not stale_after > 0:
        raise ValueError(f"stale_after must be > 0 seconds or None, got {stale_after}")
    target, numbered = _target(Path(path), step)
    rngs = _gather_rng(world)  # collective: before rank 0 goes off to write
    error = ""
    if world.is_main:
        state = {
            "format": FORMAT,
            "model": unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "sampler": sampler_state,
            "epoch": int(epoch),
            "step": int(step),
            "world_size": world.world_size,
            "rng": rngs,
            "extra": extra or {},
        }
        error = _write_main(state, target, keep_last if numbered else None, stale_after)
    _bounded_barrier(world, timeout)
    if world.distributed:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise CheckpointError(error if world.is_main else f"rank {world.rank}: {error}")
    return target


def _strip_prefix(sd: dict[str, Any]) -> dict[str, Any]:
    """Foreign checkpoints saved from a DDP wrapper carry `module.` on every key."""
    if sd and all(k.startswith("module.") for k in sd):
        return {k[len("module."):]: v for k, v in sd.items()}
    return sd


def _check_keys(module: nn.Module, sd: dict[str, Any], file: Path, rank: int) -> None:
    want = module.state_dict()
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    shapes = [f"{k} {tuple(sd[k].shape)} vs {tuple(v.shape)}" for k, v in want.items()
              if k in sd and isinstance(sd[k], torch.Tensor) and sd[k].shape != v.shape]
    if not (missing or unexpected or shapes):
        return

    def few(xs: list[str]) -> str:
        return ", ".join(xs[:5]) + (f" (+{len(xs) - 5} more)" if len(xs) > 5 else "")

    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s): {few(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s): {few(unexpected)}")
    if shapes:
        parts.append(f"{len(shapes)} shape mismatch(es) (checkpoint vs model): {few(shapes)}")
    raise CheckpointError(
        f"rank {rank}: checkpoint {file} does not match this model: " + "; ".join(parts)
        + ". It was probably saved from a different model or configuration; pass the matching "
        "model, or strict=False to load only the keys that match."
    )


def _read(file: Path, world: World, map_location: Any) -> dict[str, Any]:
    try:
        obj = torch.load(file, map_location=map_location, weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"rank {world.rank}: no checkpoint at {file}") from exc
    except PermissionError as exc:
        raise CheckpointError(
            f"rank {world.rank}: cannot read checkpoint {file}: permission denied") from exc
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile,
            ValueError) as exc:
        raise CheckpointError(
            f"rank {world.rank}: checkpoint {file} is truncated or corrupt ({exc}). It was "
            "probably cut short by a kill or a full disk outside save_checkpoint; load an older "
            "checkpoint from the same folder."
        ) from exc
    if not isinstance(obj, dict):
        raise CheckpointError(f"rank {world.rank}: {file} is not a checkpoint (a {type(obj)})")
    if "model" not in obj:  # a bare state_dict from another tool
        obj = {"model": obj}
    return obj


def load_checkpoint(
    path: str | os.PathLike[str],
    world: World,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    strict: bool = True,
    restore_rng: bool = True,
    map_location: Any = None,
) -> dict[str, Any]:
    """Load a checkpoint (a file, or a folder: its newest) on every rank into the given objects.

    Returns the rest: {"epoch", "step", "sampler", "extra", "path"}; pass "sampler" to the
    sampler's `load_state_dict` to resume mid-epoch. Each rank restores its own RNG states when
    the checkpoint was saved with at least as many ranks.
    """
    p = Path(path)
    file = latest_checkpoint(p) if p.is_dir() else p
    if file is None:
        raise CheckpointError(f"rank {world.rank}: no checkpoint (ckpt-*.pt) in folder {p}")
    ckpt = _read(file, world, world.device if map_location is None else map_location)
    module = unwrap(model)
    sd = _strip_prefix(dict(ckpt["model"]))
    if strict:
        _check_keys(module, sd, file, world.rank)
        module.load_state_dict(sd)
    else:
        want = module.state_dict()
        module.load_state_dict({k: v for k, v in sd.items()
                                if k in want and getattr(v, "shape", None) == want[k].shape},
                               strict=False)
    for obj, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler")):
        if obj is not None and ckpt.get(key) is not None:
            obj.load_state_dict(ckpt[key])
    rngs = ckpt.get("rng") or []
    if restore_rng and world.rank < len(rngs):
        set_rng_state(rngs[world.rank])
    return {"epoch": int(ckpt.get("epoch", 0)), "step": int(ckpt.get("step", 0)),
            "sampler": ckpt.get("sampler"), "extra": ckpt.get("extra", {}), "path": file,
            "world_size": ckpt.get("world_size")}
