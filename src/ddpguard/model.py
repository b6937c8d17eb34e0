"""Wrap a model for DDP as careful scripts do by hand, and accumulate gradients correctly.

`prepare_model` converts BatchNorm to SyncBatchNorm *before* wrapping, passes device ids only on
GPU, and checks once, after the first backward, that every trainable parameter received a
gradient (otherwise DDP fails one step later with a reduction error that names nothing).
`unwrap` gives the inner module for checkpoints and evaluation (`model_without_ddp`).
`accumulate` runs k micro-batches with `no_sync` on all but the last of each group, and forces a
sync on the last micro-batch of the epoch even when the epoch length is not a multiple of k.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .world import World

__all__ = [
    "AccumulationStep",
    "UnusedParametersError",
    "accumulate",
    "accumulation_plan",
    "prepare_model",
    "to_device",
    "unwrap",
    "use_syncbn",
]

_BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_DDP_PARAMS = set(inspect.signature(DDP.__init__).parameters)
log = logging.getLogger("ddpguard")


class UnusedParametersError(RuntimeError):
    """Trainable parameters got no gradient in the first backward of a DDP model."""


def unwrap(model: nn.Module) -> nn.Module:
    """The inner module of a DDP (or torch.compile) wrapper; the model itself otherwise."""
    while True:
        if isinstance(model, DDP):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def to_device(batch: Any, device: torch.device) -> Any:
    """`batch` with every tensor in it on `device`: tensors, and tensors nested in tuples,
    named tuples, lists, mappings and dataclasses; an object with its own `.to(device)` (a
    tokenizer's batch encoding, a graph batch) moves itself; anything else stays as it is. On
    the CPU the batch is returned untouched. The copy from pinned memory is asynchronous
    (`non_blocking`), so it overlaps the previous step's kernels instead of stalling the queue.
    A container type that cannot be rebuilt is returned as it is, never changed into another
    type: its tensors then stay where they were, which the model's first layer reports."""
    if device.type == "cpu":
        return batch
    return _moved(batch, device)


def _moved(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (str, bytes)) or batch is None:
        return batch
    try:
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):
            return type(batch)(*(_moved(v, device) for v in batch))
        if isinstance(batch, (tuple, list)):
            items = [_moved(v, device) for v in batch]
            return items if type(batch) is list else type(batch)(items)
        if type(batch) is not dict and callable(getattr(batch, "to", None)):
            return batch.to(device)
        if isinstance(batch, Mapping):
            moved = {k: _moved(v, device) for k, v in batch.items()}
            if type(batch) is dict:
                return moved
            out = copy.copy(batch)  # keeps a defaultdict's factory, an OrderedDict's order
            for k, v in moved.items():
                out[k] = v  # type: ignore[index]
            return out
        if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
            fields = {f.name: _moved(getattr(batch, f.name), device)
                      for f in dataclasses.fields(batch) if f.init}
            return dataclasses.replace(batch, **fields)
    except TypeError:  # a container type built some other way: left as it is
        return batch
    return batch


def _has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, _BN_TYPES) for m in model.modules())


def _install_unused_check(ddp: DDP, world: World) -> None:
    """After the first backward, name the trainable parameters that got no gradient.

    Each parameter gets a post-accumulate hook that records it; the first hook to fire queues a
    callback that runs when the whole backward pass ends. The callback compares, then removes
    every hook: the check costs one backward and nothing afterwards.
    """
    inner = ddp.module
    names = {p: n for n, p in inner.named_parameters() if p.requires_grad}
    seen: set[int] = set()
    handles: list[Any] = []
    queued = [False]

    def finish() -> None:
        for h in handles:
            h.remove()
        handles.clear()
        missing = [n for p, n in names.items() if id(p) not in seen]
        if missing:
            shown = ", ".join(missing[:8]) + (f" (+{len(missing) - 8} more)" if len(missing) > 8
                                              else "")
            raise UnusedParametersError(
                f"rank {world.rank}: {len(missing)} trainable parameter(s) received no gradient "
                f"in the first backward: {shown}. DDP would fail at the next step with "
                "'Expected to have finished reduction in the prior iteration'. Either use them "
                "in forward, freeze them (requires_grad_(False)) before prepare_model, or pass "
                "find_unused_parameters=True to prepare_model (slower: an extra graph traversal "
                "every step)."
            )

    def hook(param: torch.Tensor) -> None:
        seen.add(id(param))
        if not queued[0]:
            queued[0] = True
            torch.autograd.Variable._execution_engine.queue_callback(finish)

    for p in names:
        handles.append(p.register_post_accumulate_grad_hook(hook))


def prepare_model(
    model: nn.Module,
    world: World,
    *,
    sync_batchnorm: bool | str = "auto",
    check_unused: bool = True,
    **ddp_kwargs: Any,
) -> nn.Module:
    """Move `model` to the rank's device and wrap it in DDP when the world has several ranks.

    - BatchNorm becomes SyncBatchNorm before wrapping (`sync_batchnorm="auto"`: when the world
      is larger than one, on CUDA, and the model has BatchNorm; torch's SyncBatchNorm has no CPU
      kernel). Converting after wrapping, as some scripts do, leaves DDP holding the old modules.
    - With SyncBatchNorm the running statistics are computed from the same global batch on every
      rank, so the buffers already agree and buffer broadcasting is off by default
      (`forward_sync_buffers=False`, formerly `broadcast_buffers=False`): with it on, DDP
      broadcasts buffers at every forward, and a forward that runs on some ranks only
      (evaluation on rank 0 inside an `if`, docs/pitfalls.md) then blocks in that broadcast.
    - `device_ids`/`output_device` are passed on GPU only (DDP rejects them for CPU modules).
    - Single process: returns the model unwrapped, on its device.
    """
    if sync_batchnorm not in (True, False, "auto"):
        raise ValueError(f"sync_batchnorm must be True, False or 'auto', got {sync_batchnorm!r}")
    model = model.to(world.device)
    if not world.distributed:
        return model
    if not torch.distributed.is_initialized():
        raise RuntimeError(
            f"rank {world.rank}: prepare_model needs the process group; call ddpguard.init() "
            "first and pass the World it returns"
        )
    if use_syncbn(model, world, sync_batchnorm):
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        # Buffers are identical by construction now; stop DDP broadcasting them every forward.
        if "forward_sync_buffers" in _DDP_PARAMS:
            ddp_kwargs.setdefault("forward_sync_buffers", False)
        else:  # torch before the rename
            ddp_kwargs.setdefault("broadcast_buffers", False)
    elif _has_batchnorm(model) and world.is_main:
        log.warning(
            "the model has BatchNorm but runs on %s: torch's SyncBatchNorm needs CUDA, so each "
            "rank normalises with its own batch statistics and DDP broadcasts rank 0's running "
            "statistics at every forward", world.device.type)
    if world.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [world.device.index])
        ddp_kwargs.setdefault("output_device", world.device.index)
    ddp = DDP(model, **ddp_kwargs)
    if check_unused and not ddp_kwargs.get("find_unused_parameters", False):
        _install_unused_check(ddp, world)
    return ddp


def use_syncbn(model: nn.Module, world: World, setting: bool | str) -> bool:
    """Whether prepare_model converts BatchNorm to SyncBatchNorm. Pure in (model, world).

    "auto": a world of several ranks on CUDA with BatchNorm in the model. torch's DDP refuses
    SyncBatchNorm on CPU modules, so asking for it there is an error, not a silent no-op.
    """
    if setting is False or not world.distributed or not _has_batchnorm(model):
        return False
    if world.device.type != "cuda":
        if setting is True:
            raise ValueError(
                f"rank {world.rank}: sync_batchnorm=True needs CUDA devices (this rank runs on "
                f"{world.device}); torch's SyncBatchNorm does not run on CPU. Use "
                "sync_batchnorm='auto' or False."
            )
        return False
    return True


@dataclasses.dataclass(frozen=True)
class AccumulationStep:
    """What one micro-step should do: scale its loss by `scale`, step the optimizer if `sync`."""

    micro_step: int
    sync: bool
    scale: float
    group_size: int


def accumulation_plan(micro_step: int, every: int, epoch_length: int | None) -> AccumulationStep:
    """Pure: where micro-step `micro_step` (0-based within the epoch) sits in its group of `every`.

    The last group of an epoch may be shorter; its losses are scaled by 1/its real size so the
    update is still the mean over the micro-batches it contains.
    """
    if every < 1:
        raise ValueError(f"accumulation every={every} must be >= 1")
    if micro_step < 0:
        raise ValueError(f"micro_step must be >= 0, got {micro_step}")
    if epoch_length is not None and not 0 <= micro_step < epoch_length:
        raise ValueError(f"micro_step {micro_step} is outside an epoch of {epoch_length} batches")
    start = (micro_step // every) * every
    size = every if epoch_length is None else min(every, epoch_length - start)
    sync = micro_step - start == size - 1
    return AccumulationStep(micro_step, sync, 1.0 / size, size)


def _every_from_plan(every: int | None, plan: Any) -> int:
    """Accumulation steps from `every` or a BatchPlan (which must be for this world size)."""
    if plan is None:
        return 1 if every is None else every
    steps = int(plan.accumulation_steps)
    if every is not None and every != steps:
        raise ValueError(
            f"accumulate got every={every} but the plan says {steps} accumulation steps "
            f"({plan.describe()}); pass only plan="
        )
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() != plan.world_size:
        raise ValueError(
            f"rank {dist.get_rank()}: the batch plan is for world_size={plan.world_size} but "
            f"this job has {dist.get_world_size()} ranks; rebuild it with "
            f"plan.for_world_size({dist.get_world_size()})"
        )
    return steps


@contextlib.contextmanager
def accumulate(
    model: nn.Module, micro_step: int, *, every: int | None = None,
    epoch_length: int | None = None, plan: Any = None,
) -> Iterator[AccumulationStep]:
    """Context for one micro-step of gradient accumulation over `every` micro-batches.

        for i, batch in enumerate(loader):
            with dg.accumulate(model, i, every=4, epoch_length=len(loader)) as acc:
                (loss_fn(model, batch) * acc.scale).backward()
            if acc.sync:
                optimizer.step(); optimizer.zero_grad()

    Backward runs under `no_sync` except on the last micro-step of a group, where DDP all-reduces
    the accumulated gradients once. Pass `epoch_length` (batches this epoch, equal on every rank)
    so the final, possibly shorter, group still syncs and is averaged over its real size.

    `plan=BatchPlan(...)` (ddpguard.batch_plan) gives `every` = plan.accumulation_steps: with
    micro-batches of plan.micro from an EvenSampler(global_batch_size=...), each optimizer step
    is then the mean gradient over the same global batch on any world size. Default every=1.
    """
    step = accumulation_plan(micro_step, _every_from_plan(every, plan), epoch_length)
    if not step.sync and isinstance(model, DDP):
        with model.no_sync():
            yield step
    else:
        yield step
