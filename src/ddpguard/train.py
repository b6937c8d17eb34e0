"""`fit()`: one plain training loop composing the parts. Users who prefer their own loop use the
parts directly (prepare_model, accumulate, evaluate, save/load_checkpoint); this file is the
worked example of doing so correctly."""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .batch_plan import BatchPlan, make_probe, rescale_lr, start_plan
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .fit_config import FitConfig, FitResult
from .metrics import LossWatch, evaluate, split_loss
from .model import accumulate, prepare_model, to_device, unwrap
from .precision import Precision
from .readback import Readback, scalars
from .world import World

__all__ = ["FitConfig", "FitResult", "fit"]

LossFn = Callable[[nn.Module, Any], Any]


# Steps between reading losses back for the log and progress bar.
_LOG_EVERY = 10


def _mean_loss(out: Any) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """(mean loss, samples, weights or None) from a loss_fn result. Plain per-sample values take
    one `mean()`; a (values, weights) pair gives the weighted (e.g. per-token) mean."""
    if isinstance(out, torch.Tensor) and out.dim() == 1:
        return out.mean(), int(out.shape[0]), None
    values, weights = split_loss(out)
    return values.sum() / weights.sum().clamp_min(1e-12), int(values.shape[0]), weights

def _make_sampler(cfg: FitConfig, dataset: Any, world: World, *, shuffle: bool,
                  max_tokens: int | None = None,
                  global_batch_size: int | None = None) -> tuple[Any, bool]:
    """(sampler, is_batch_sampler) for a dataset, the same kind on every rank."""
    if cfg.max_tokens is not None:
        from .sampling import TokenBatchSampler

        lengths = getattr(dataset, "lengths", None)
        if lengths is None:
            raise ValueError("max_tokens needs a dataset with .lengths (JsonlDataset(..., "
                             "length_key=...))")
        return TokenBatchSampler(lengths, max_tokens or cfg.max_tokens, world.world_size,
                                 world.rank, shuffle=shuffle, seed=cfg.seed), True
    from .sampling import EvenSampler

    return EvenSampler(len(dataset), world.world_size, world.rank, shuffle=shuffle,
                       seed=cfg.seed, tail="pad", global_batch_size=global_batch_size), False


def _loader(cfg: FitConfig, dataset: Any, sampler: Any, batched: bool, batch_size: int | None,
            collate_fn: Any) -> Any:
    from .data import make_loader

    if batched:
        return make_loader(dataset, batch_sampler=sampler, num_workers=cfg.num_workers,
                           collate_fn=collate_fn, seed=cfg.seed)
    return make_loader(dataset, batch_size=batch_size, sampler=sampler,
                       num_workers=cfg.num_workers, collate_fn=collate_fn, seed=cfg.seed)


class _CsvLog:
    def __init__(self, path: str | None, world: World) -> None:
        self.f: Any = None
        if path is not None and world.is_main:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fresh = not Path(path).exists()
            self.f = open(path, "a", newline="")  # noqa: SIM115 - closed in close()
            self.w = csv.writer(self.f)
            if fresh:
                self.w.writerow(["kind", "epoch", "step", "loss", "lr", "seconds"])

    def row(self, *values: Any) -> None:
        if self.f is not None:
            self.w.writerow(values)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def _progress(cfg: FitConfig, world: World, total: int | None) -> Any:
    if not (cfg.progress and world.is_main):
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # optional dependency
        return None
    return tqdm(total=total, unit="step", dynamic_ncols=True, mininterval=2.0)


def _batch_plan(cfg: FitConfig, world: World, ddp: nn.Module, data: Any, loss_fn: LossFn,
                collate_fn: Any, oom_probe: Callable[[int], object] | None, opt: Any,
                scheduler: Any) -> BatchPlan | None:
    """The plan for THIS world size (rebuilt on resume: only the global batch is saved state),
    the micro-batch search, and the learning-rate note; None without a global batch."""
    if cfg.global_batch_size is None:
        return None
    probe = oom_probe
    if probe is None and world.device.type == "cuda":
        probe = make_probe(ddp, data, loss_fn, collate_fn)
    plan = start_plan(cfg.global_batch_size, world.world_size,
                      micro_batch_size=cfg.micro_batch_size, max_micro_batch=cfg.max_micro_batch,
                      probe=probe)
    world.print(f"batch plan: {plan.describe()}")
    if cfg.baseline_batch_size is not None:
        world.print(rescale_lr(opt, cfg.baseline_batch_size, cfg.global_batch_size, cfg.lr_rule,
                               scheduler))
    return plan


def fit(
    model: nn.Module,
    train_data: Any,
    loss_fn: LossFn,
    optimizer: torch.optim.Optimizer | Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
    *,
    config: FitConfig | None = None,
    eval_data: Any = None,
    scheduler: Any = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    world: World | None = None,
    on_batch: Callable[[int, int, Any], None] | None = None,
    oom_probe: Callable[[int], object] | None = None,
) -> FitResult:
    """Train `model` on `train_data` on every rank of the job (start it with torchrun or
    `ddpguard run`; a plain `python` runs one process).

    `loss_fn(module, batch)` returns per-sample losses (1-D) or (values, weights), as for
    `evaluate`; the training loss of a micro-batch is sum(values)/sum(weights). The batch it gets
    is already on the rank's device (`to_device`), as is the one `on_batch` gets. `optimizer` is an
    optimizer over `model.parameters()` or a factory taking the parameters. `on_batch(epoch,
    step, batch)` is called for each micro-batch (after its backward), for ledgers and metrics.
    With `config.global_batch_size`, `oom_probe(micro)` is run on every rank at start to find
    the largest micro-batch that fits (raise torch.OutOfMemoryError when it does not); default
    on CUDA: one forward and backward of a micro-batch; on CPU: no search unless given.
    Forms the process group when none exists (and shuts it down at the end).
    """
    from .session import init, shutdown

    cfg = config or FitConfig()
    own_group = world is None
    world = init() if world is None else world
    try:
        return _fit(model, train_data, loss_fn, optimizer, cfg, eval_data, scheduler,
                    collate_fn, world, on_batch, oom_probe)
    finally:
        if own_group:
            shutdown(world)


def _fit(model: nn.Module, train_data: Any, loss_fn: LossFn, optimizer: Any, cfg: FitConfig,
         eval_data: Any, scheduler: Any, collate_fn: Any, world: World,
         on_batch: Callable[[int, int, Any], None] | None,
         oom_probe: Callable[[int], object] | None) -> FitResult:
    ddp = prepare_model(model, world)
    opt = optimizer if isinstance(optimizer, torch.optim.Optimizer) else optimizer(
        ddp.parameters())
    prec = Precision(cfg.precision, world.device)
    plan = _batch_plan(cfg, world, ddp, train_data, loss_fn, collate_fn, oom_probe, opt,
                       scheduler)
    micro = plan.micro if plan is not None else cfg.batch_size
    every = plan.accumulation_steps if plan is not None else cfg.accumulate
    sampler, batched = _make_sampler(cfg, train_data, world, shuffle=cfg.shuffle,
                                     global_batch_size=cfg.global_batch_size)
    loader = _loader(cfg, train_data, sampler, batched, micro, collate_fn)
    eval_loader = None
    if eval_data is not None:
        ev_sampler, ev_batched = _make_sampler(
            cfg, eval_data, world, shuffle=False, max_tokens=cfg.eval_batch_size)
        eval_loader = _loader(cfg, eval_data, ev_sampler, ev_batched,
                              cfg.eval_batch_size or micro, collate_fn)
    step, start_epoch, resumed = 0, 0, None
    if cfg.resume and cfg.checkpoint_dir and latest_checkpoint(cfg.checkpoint_dir) is not None:
        info = load_checkpoint(cfg.checkpoint_dir, world, model=ddp, optimizer=opt,
                               scheduler=scheduler, scaler=prec.scaler)
        step, start_epoch, resumed = info["step"], info["epoch"], str(info["path"])
        if info["sampler"] is not None:
            sampler.load_state_dict(info["sampler"])
            start_epoch = sampler.epoch  # the sampler may skip an epoch with nothing left
        world.print(f"resumed from {resumed} (saved on {info.get('world_size')} rank(s)): "
                    f"epoch {start_epoch}, step {step}")
    log = _CsvLog(cfg.log_csv, world)
    watch = LossWatch(world, every=cfg.nan_check_every)
    bar = _progress(cfg, world, cfg.max_steps)
    result = FitResult(step, start_epoch, 0, 0, 0.0, [], [], resumed,
                       plan.state_dict() if plan is not None else None)
    t0 = time.perf_counter()
    done = cfg.max_steps is not None and step >= cfg.max_steps
    # Checkpoints record what this rank CONSUMED (batches done x batch), never what the sampler
    # yielded: DataLoader workers prefetch ahead, and those samples were not trained on.
    per_batch = 1 if batched else int(micro or 1)

    def checkpoint(epoch: int, consumed: int | None) -> None:
        if cfg.checkpoint_dir is None:
            return
        state = sampler.state_dict(consumed=consumed) if consumed is not None else None
        if consumed is None:  # pass finished: the sampler's state points at the next epoch
            state = sampler.state_dict(consumed=len(sampler))
        save_checkpoint(cfg.checkpoint_dir, world, model=ddp, optimizer=opt, scheduler=scheduler,
                        scaler=prec.scaler, sampler_state=state,
                        epoch=epoch if consumed is not None else epoch + 1, step=step,
                        keep_last=cfg.keep_last, timeout=cfg.checkpoint_timeout)

    weight_sum: Any = 0  # the token weights of batched passes, still on the device
    # Losses are read back in groups, and on a GPU one group late (readback.py): a float() per
    # step, or a wait for each group, would stall the GPU's queue.
    pending: list[tuple[int, int, Any, float]] = []  # (epoch, step, lr, seconds) per step
    pending_losses: list[torch.Tensor] = []
    losses_back = Readback()

    def drain(wait: bool = True) -> None:
        ready = []
        if pending:
            ready = losses_back.push(pending.copy(), scalars(pending_losses))
            pending.clear()
            pending_losses.clear()
        if wait:
            ready += losses_back.wait_all()
        for rows, losses in ready:
            for (ep, st, lr, secs), lv in zip(rows, losses, strict=True):
                result.train_loss.append((st, lv))
                log.row("train", ep, st, f"{lv:.6f}", lr, f"{secs:.3f}")
            if bar is not None:
                bar.update(len(rows))
                bar.set_postfix(epoch=rows[-1][0], loss=f"{losses[-1]:.4f}")

    finished = False
    try:
        if cfg.eval_at_start and eval_loader is not None and resumed is None:
            ev = evaluate(ddp, eval_loader, loss_fn, world)
            result.eval_loss.append((step, ev.loss))
            log.row("eval", start_epoch, step, f"{ev.loss:.6f}", "", "0.000")
        for epoch in range(start_epoch, cfg.epochs):
            if done:
                break
            # Keeps a mid-epoch resume position when `epoch` is the resumed one; len(loader) is
            # then what is left of the pass, and consumed counts restart from the resume point.
            sampler.set_epoch(epoch)
            n_batches = len(loader)
            ddp.train()
            batches_done = 0
            for i, batch in enumerate(loader):
                batch = to_device(batch, world.device)
                with accumulate(ddp, i, every=every, epoch_length=n_batches) as acc:
                    with prec.autocast():
                        loss, n_samples, weights = _mean_loss(loss_fn(ddp, batch))
                    # Skipping the multiply when it is 1 saves an op and its backward node.
                    prec.backward(loss if acc.scale == 1.0 else loss * acc.scale)
                watch.update(loss, step)
                batches_done += 1
                result.samples += n_samples
                if batched and weights is not None:  # summed on the device, read at the end
                    weight_sum = weight_sum + weights.detach().double().sum()
                elif batched:
                    result.tokens += n_samples
                if on_batch is not None:
                    on_batch(epoch, step, batch)
                if not acc.sync:
                    continue
                if cfg.grad_clip is not None:
                    prec.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(ddp.parameters(), cfg.grad_clip)
                prec.step(opt)
                opt.zero_grad(set_to_none=True)
                if scheduler is not None:
                    scheduler.step()
                step += 1
                pending.append((epoch, step, opt.param_groups[0]["lr"], time.perf_counter() - t0))
                pending_losses.append(loss.detach())
                done = cfg.max_steps is not None and step >= cfg.max_steps
                if len(pending) >= _LOG_EVERY or done:
                    drain(wait=done)
                last_of_epoch = batches_done == n_batches
                if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0
                        and not last_of_epoch and not done):
                    watch.flush()  # never checkpoint weights a NaN already reached
                    drain()  # free now (flush waited): the log is whole up to the checkpoint
                    checkpoint(epoch, batches_done * per_batch)
                if done:
                    break
            drain()
            watch.flush()
            if eval_loader is not None:
                ev = evaluate(ddp, eval_loader, loss_fn, world)
                result.eval_loss.append((step, ev.loss))
                log.row("eval", epoch, step, f"{ev.loss:.6f}", "",
                        f"{time.perf_counter() - t0:.3f}")
                world.print(f"epoch {epoch}: step {step}, eval loss {ev.loss:.4f} "
                            f"over {ev.count} samples")
            if done and batches_done < n_batches:
                checkpoint(epoch, batches_done * per_batch)
            else:
                checkpoint(epoch, None)
            result.epochs_done = epoch + 1
        finished = True
    finally:
        try:
            drain()  # waits for the device: after a CUDA error it raises again
            result.tokens += int(weight_sum)
        except Exception:
            if finished:
                raise
            # else the loop's own error is the one to report, not this echo of it
        finally:
            log.close()
            if bar is not None:
                bar.close()
    result.steps = step
    result.seconds = time.perf_counter() - t0
    unwrap(ddp).train()
    return result
