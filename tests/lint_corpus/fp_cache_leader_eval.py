"""A script in the shape of the old example trainers: one process per GPU under
`torch.distributed.launch`, `--local_rank` -1 for a single process. The features cache is built by
the leader first (the others wait in a barrier); evaluation asks for the cache with
`evaluate=True`, which skips both barriers, so rank 0 may evaluate alone. The model wrapped in
`train()` is not the model that `main()` reloads for evaluation."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def load_features(args, evaluate=False):
    if args.local_rank not in [-1, 0] and not evaluate:
        dist.barrier()  # the others wait until the leader has written the cache
    path = os.path.join(args.data_dir, "dev.pt" if evaluate else "train.pt")
    if os.path.exists(path):
        feats = torch.load(path, map_location="cpu")
    else:
        feats = torch.randn(64, 8)
        if args.local_rank in [-1, 0]:
            torch.save(feats, path)  # expect: DDP017
    if args.local_rank == 0 and not evaluate:
        dist.barrier()  # the leader releases them
    return feats


def evaluate(args, model):
    feats = load_features(args, evaluate=True)
    with torch.no_grad():
        return model(feats).mean().item()


def train(args, model):
    feats = load_features(args)
    model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        loss = model(feats).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if args.local_rank in [-1, 0] and step % 5 == 0:  # noqa: SIM102 (the original's shape)
            # metrics average badly over ranks: only the single process evaluates here
            if args.local_rank == -1 and args.eval_during_training:
                print(evaluate(args, model))
        if args.local_rank in [-1, 0] and step == 9:
            os.makedirs(args.out, exist_ok=True)
            torch.save(model.module.state_dict(), f"{args.out}/model.pt")  # expect: DDP017
            torch.save(opt.state_dict(), os.path.join(args.out, "optimizer.pt"))
            torch.save(args, os.path.join(args.out, "args.bin"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--data_dir", default=".")
    parser.add_argument("--out", default="out")
    parser.add_argument("--eval_during_training", action="store_true")
    args = parser.parse_args()
    if args.local_rank != -1:
        dist.init_process_group("gloo")
    model = torch.nn.Linear(8, 1)
    train(args, model)
    if args.local_rank in [-1, 0]:
        model = torch.nn.Linear(8, 1)
        model.load_state_dict(torch.load(os.path.join(args.out, "model.pt"), map_location="cpu"))
        print(evaluate(args, model))
    if dist.is_initialized() and dist.get_rank() == 0:
        print("done")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
