"""`fit()`: one plain training loop composing the parts. Users who prefer their own loop use the
parts directly (prepare_model, accumulate, evaluate, save/load_checkpoint); this file is the
worked example of doing so correctly."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .batch_plan import BatchPlan, make_probe, rescale_lr, start_plan
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .fit_config import FitConfig, FitResult
from .metrics import LossWatch, evaluate, split_loss
from .model import accumulate, prepare_model, to_device, unwrap
from .precision import Precision
from .train_log import CsvLog, LossLog
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


@dataclass(frozen=True)
class FitInputs:
    """What `fit()` was given, in one object (the loop's functions take it instead of a dozen
    arguments)."""

    model: nn.Module
    train_data: Any
    loss_fn: LossFn
    optimizer: Any   # an optimizer, or a factory taking the parameters
    cfg: FitConfig
    world: World
    eval_data: Any = None
    scheduler: Any = None
    collate_fn: Any = None
    on_batch: Callable[[int, int, Any], None] | None = None
    oom_probe: Callable[[int], object] | None = None


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
        return _fit(FitInputs(model, train_data, loss_fn, optimizer, cfg, world, eval_data,
                              scheduler, collate_fn, on_batch, oom_probe))
    finally:
        if own_group:
            shutdown(world)


@dataclass
class _Trainer:
    """The parts `_fit` assembles once, and the loop's running state."""

    inputs: FitInputs
    ddp: nn.Module
    opt: Any
    prec: Precision
    every: int
    sampler: Any
    batched: bool
    loader: Any
    eval_loader: Any
    per_batch: int
    log: CsvLog
    watch: LossWatch
    bar: Any
    result: FitResult
    losses: LossLog
    step: int
    t0: float
    done: bool
    weight_sum: Any = 0  # the token weights of batched passes, still on the device

    def checkpoint(self, epoch: int, consumed: int | None) -> None:
        cfg, world = self.inputs.cfg, self.inputs.world
        if cfg.checkpoint_dir is None:
            return
        sampler = self.sampler
        state = sampler.state_dict(consumed=consumed) if consumed is not None else None
        if consumed is None:  # pass finished: the sampler's state points at the next epoch
            state = sampler.state_dict(consumed=len(sampler))
        save_checkpoint(cfg.checkpoint_dir, world, model=self.ddp, optimizer=self.opt,
                        scheduler=self.inputs.scheduler, scaler=self.prec.scaler,
                        sampler_state=state,
                        epoch=epoch if consumed is not None else epoch + 1, step=self.step,
                        keep_last=cfg.keep_last, timeout=cfg.checkpoint_timeout)


def _build(job: FitInputs) -> _Trainer:
    """Wrap the model, make the optimizer, plan the batches, build the loaders, resume."""
    cfg, world = job.cfg, job.world
    ddp = prepare_model(job.model, world)
    opt = job.optimizer if isinstance(job.optimizer, torch.optim.Optimizer) else job.optimizer(
        ddp.parameters())
    prec = Precision(cfg.precision, world.device)
    plan = _batch_plan(cfg, world, ddp, job.train_data, job.loss_fn, job.collate_fn,
                       job.oom_probe, opt, job.scheduler)
    micro = plan.micro if plan is not None else cfg.batch_size
    every = plan.accumulation_steps if plan is not None else cfg.accumulate
    sampler, batched = _make_sampler(cfg, job.train_data, world, shuffle=cfg.shuffle,
                                     global_batch_size=cfg.global_batch_size)
    loader = _loader(cfg, job.train_data, sampler, batched, micro, job.collate_fn)
    eval_loader = None
    if job.eval_data is not None:
        ev_sampler, ev_batched = _make_sampler(
            cfg, job.eval_data, world, shuffle=False, max_tokens=cfg.eval_batch_size)
        eval_loader = _loader(cfg, job.eval_data, ev_sampler, ev_batched,
                              cfg.eval_batch_size or micro, job.collate_fn)
    step, start_epoch, resumed = 0, 0, None
    if cfg.resume and cfg.checkpoint_dir and latest_checkpoint(cfg.checkpoint_dir) is not None:
        info = load_checkpoint(cfg.checkpoint_dir, world, model=ddp, optimizer=opt,
                               scheduler=job.scheduler, scaler=prec.scaler)
        step, start_epoch, resumed = info["step"], info["epoch"], str(info["path"])
        if info["sampler"] is not None:
            sampler.load_state_dict(info["sampler"])
            start_epoch = sampler.epoch  # the sampler may skip an epoch with nothing left
        world.print(f"resumed from {resumed} (saved on {info.get('world_size')} rank(s)): "
                    f"epoch {start_epoch}, step {step}")
    log = CsvLog(cfg.log_csv, world)
    watch = LossWatch(world, every=cfg.nan_check_every)
    bar = _progress(cfg, world, cfg.max_steps)
    result = FitResult(step, start_epoch, 0, 0, 0.0, [], [], resumed,
                       plan.state_dict() if plan is not None else None)
    t0 = time.perf_counter()
    done = cfg.max_steps is not None and step >= cfg.max_steps
    # Checkpoints record what this rank CONSUMED (batches done x batch), never what the sampler
    # yielded: DataLoader workers prefetch ahead, and those samples were not trained on.
    per_batch = 1 if batched else int(micro or 1)
    return _Trainer(job, ddp, opt, prec, every, sampler, batched, loader, eval_loader, per_batch,
                    log, watch, bar, result, LossLog(result, log, bar), step, t0, done)


def _fit(job: FitInputs) -> FitResult:
    t = _build(job)
    finished = False
    try:
        _train(t)
        finished = True
    finally:
        try:
            t.losses.drain()  # waits for the device: after a CUDA error it raises again
            t.result.tokens += int(t.weight_sum)
        except Exception:
            if finished:
                raise
            # else the loop's own error is the one to report, not this echo of it
        finally:
            t.log.close()
            if t.bar is not None:
                t.bar.close()
    t.result.steps = t.step
    t.result.seconds = time.perf_counter() - t.t0
    unwrap(t.ddp).train()
    return t.result


def _evaluate(t: _Trainer, epoch: int) -> None:
    job = t.inputs
    ev = evaluate(t.ddp, t.eval_loader, job.loss_fn, job.world)
    t.result.eval_loss.append((t.step, ev.loss))
    t.log.row("eval", epoch, t.step, f"{ev.loss:.6f}", "", f"{time.perf_counter() - t.t0:.3f}")
    job.world.print(f"epoch {epoch}: step {t.step}, eval loss {ev.loss:.4f} "
                    f"over {ev.count} samples")


def _train(t: _Trainer) -> None:
    """The loop: epochs, each a pass over the loader, an evaluation and a checkpoint."""
    job, cfg = t.inputs, t.inputs.cfg
    start_epoch = t.result.epochs_done
    if cfg.eval_at_start and t.eval_loader is not None and t.result.resumed_from is None:
        ev = evaluate(t.ddp, t.eval_loader, job.loss_fn, job.world)
        t.result.eval_loss.append((t.step, ev.loss))
        t.log.row("eval", start_epoch, t.step, f"{ev.loss:.6f}", "", "0.000")
    for epoch in range(start_epoch, cfg.epochs):
        if t.done:
            break
        # Keeps a mid-epoch resume position when `epoch` is the resumed one; len(loader) is
        # then what is left of the pass, and consumed counts restart from the resume point.
        t.sampler.set_epoch(epoch)
        n_batches = len(t.loader)
        t.ddp.train()
        batches_done = 0
        # Under `ddpguard run` the guard counts each batch in DataLoader's iterator (its hooks
        # on DataLoader.__iter__ and the iterator's __next__, guard/progress.py): a rank that
        # runs out of batches early is seen there.
        for i, batch in enumerate(t.loader):
            batches_done += 1
            if _train_step(t, epoch, i, batch, n_batches, batches_done):
                break
        t.losses.drain()
        t.watch.flush()
        if t.eval_loader is not None:
            _evaluate(t, epoch)
        if t.done and batches_done < n_batches:
            t.checkpoint(epoch, batches_done * t.per_batch)
        else:
            t.checkpoint(epoch, None)
        t.result.epochs_done = epoch + 1


def _forward_backward(t: _Trainer, batch: Any, i: int,
                      n_batches: int) -> tuple[Any, torch.Tensor, int, torch.Tensor | None]:
    """One micro-batch: forward and backward, gradients synced only on the accumulation's last
    micro-step (`accumulate`). The guard's hooks on DDP.forward and torch.autograd.backward
    (guard/progress.py) mark both as signs of life under `ddpguard run`."""
    with accumulate(t.ddp, i, every=t.every, epoch_length=n_batches) as acc:
        with t.prec.autocast():
            loss, n_samples, weights = _mean_loss(t.inputs.loss_fn(t.ddp, batch))
        # Skipping the multiply when it is 1 saves an op and its backward node.
        t.prec.backward(loss if acc.scale == 1.0 else loss * acc.scale)
    return acc, loss, n_samples, weights


def _train_step(t: _Trainer, epoch: int, i: int, batch: Any, n_batches: int,
                batches_done: int) -> bool:
    """One batch of the loop, and the optimizer step when it ends an accumulation. True when
    training is done (max_steps reached)."""
    job, cfg = t.inputs, t.inputs.cfg
    batch = to_device(batch, job.world.device)
    acc, loss, n_samples, weights = _forward_backward(t, batch, i, n_batches)
    t.watch.update(loss, t.step)
    t.result.samples += n_samples
    if t.batched and weights is not None:  # summed on the device, read at the end
        t.weight_sum = t.weight_sum + weights.detach().double().sum()
    elif t.batched:
        t.result.tokens += n_samples
    if job.on_batch is not None:
        job.on_batch(epoch, t.step, batch)
    if not acc.sync:
        return False
    if cfg.grad_clip is not None:
        t.prec.unscale_(t.opt)
        torch.nn.utils.clip_grad_norm_(t.ddp.parameters(), cfg.grad_clip)
    # The guard's optimizer-step hook (guard/progress.py) counts this step under `ddpguard run`.
    t.prec.step(t.opt)
    t.opt.zero_grad(set_to_none=True)
    if job.scheduler is not None:
        job.scheduler.step()
    t.step += 1
    t.losses.add((epoch, t.step, t.opt.param_groups[0]["lr"], time.perf_counter() - t.t0), loss)
    t.done = cfg.max_steps is not None and t.step >= cfg.max_steps
    if len(t.losses.pending) >= _LOG_EVERY or t.done:
        t.losses.drain(wait=t.done)
    last_of_epoch = batches_done == n_batches
    if (cfg.checkpoint_every and t.step % cfg.checkpoint_every == 0
            and not last_of_epoch and not t.done):
        t.watch.flush()  # never checkpoint weights a NaN already reached
        t.losses.drain()  # free now (flush waited): the log is whole up to the checkpoint
        t.checkpoint(epoch, batches_done * t.per_batch)
    return t.done
