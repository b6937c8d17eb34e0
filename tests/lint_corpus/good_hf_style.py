# ruff: noqa  (test data for ddpguard lint: kept as the seeds wrote it)
"""Correct script in the HF/args style: args.local_rank in [-1, 0] for logging only."""
import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    if args.local_rank != -1:
        dist.init_process_group("nccl")
        torch.cuda.set_device(args.local_rank)
        dist.barrier()
    dataset = torch.utils.data.TensorDataset(torch.randn(32, 2))
    sampler = RandomSampler(dataset) if args.local_rank == -1 else DistributedSampler(dataset)
    loader = DataLoader(dataset, sampler=sampler, batch_size=4, drop_last=True)
    model = torch.nn.Linear(2, 2).cuda()
    if args.local_rank != -1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[args.local_rank], output_device=args.local_rank)
    for epoch in range(2):
        if args.local_rank != -1:
            sampler.set_epoch(epoch)
        for (x,) in loader:
            model(x.cuda()).sum().backward()
        if args.local_rank in [-1, 0]:
            print("epoch", epoch)
    if args.local_rank != -1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
