"""One rank of `ddpguard demo` (started by torch.distributed.run, never by hand):
`python -m torch.distributed.run --nproc-per-node 2 -m ddpguard.demo.worker --out DIR ...`."""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path

import torch


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ddpguard.demo.worker")
    p.add_argument("--out", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--val", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--context", type=int, default=4)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    from ..data import JsonlDataset
    from ..sampling import TokenBatchSampler
    from ..session import init, shutdown
    from ..train import FitConfig, fit
    from .net import PAD, ByteLM, collate, lm_loss, warmup_cosine

    world = init()
    try:
        torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP checks)
        train = JsonlDataset(args.train, length_key="len")
        val = JsonlDataset(args.val, length_key="len")
        model = ByteLM(d_model=args.d_model, n_layers=args.layers,
                       context=args.context)
        out = Path(args.out)
        cfg = FitConfig(
            epochs=args.epochs, batch_size=None, max_tokens=args.max_tokens,
            max_steps=args.max_steps, checkpoint_dir=str(out / "checkpoints"),
            checkpoint_every=args.checkpoint_every, keep_last=2, resume=args.resume,
            log_csv=str(out / "log.csv"), seed=args.seed, progress=True,
            grad_clip=1.0, eval_at_start=True,
        )
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                                betas=(0.9, 0.98))
        # The schedule's length is the whole job's, fixed before a resume, so the scheduler
        # state in the checkpoint continues the same curve.
        per_epoch = len(TokenBatchSampler(train.lengths, args.max_tokens, world.world_size,
                                          world.rank, seed=args.seed))
        total = per_epoch * args.epochs  # not max_steps: a longer resumed run keeps the curve
        sched = None
        if args.schedule == "cosine":
            sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(total, args.warmup))
        tokens_at: dict[int, torch.Tensor] = {}

        def count(epoch: int, step: int, batch: torch.Tensor) -> None:
            # Predicted bytes of this micro-batch, booked to the optimizer step it ends in.
            # Kept as tensors and read once at the end: an int() per step would stall a GPU.
            n = (batch[:, 1:] != PAD).sum()
            tokens_at[step + 1] = tokens_at[step + 1] + n if step + 1 in tokens_at else n

        started = time.perf_counter()
        res = fit(model, train, lm_loss, opt, config=cfg, scheduler=sched, eval_data=val,
                  collate_fn=collate, world=world, on_batch=count)
        tokens = torch.tensor([float(res.tokens)])
        if world.distributed:
            torch.distributed.all_reduce(tokens)
        if world.is_main:
            _append_tokens(out / "throughput.csv", tokens_at)
            summary = {
                "world_size": world.world_size, "backend": world.backend,
                "steps": res.steps, "epochs": res.epochs_done, "tokens": int(tokens.item()),
                "seconds": res.seconds, "wall_seconds": time.perf_counter() - started,
                "train_loss": res.train_loss, "eval_loss": res.eval_loss,
                "resumed_from": res.resumed_from, "lr": args.lr, "d_model": args.d_model,
                "layers": args.layers, "context": args.context, "max_tokens": args.max_tokens,
            }
            (out / "summary.json").write_text(json.dumps(summary))
    finally:
        shutdown(world)
    return 0


def _append_tokens(path: Path, tokens_at: dict[int, torch.Tensor]) -> None:
    """Rank 0's predicted bytes per optimizer step, for the throughput chart."""
    fresh = not path.exists()
    steps = sorted(tokens_at)
    counts = torch.stack([tokens_at[s] for s in steps]).tolist() if steps else []
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if fresh:
            w.writerow(["step", "tokens"])
        for step, n in zip(steps, counts, strict=True):
            w.writerow([step, int(n)])


if __name__ == "__main__":
    raise SystemExit(main())
