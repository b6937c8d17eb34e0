# Our fixture (issue 20): tests of the launch mode, not of the rank. `main_process()` is true
# on every process of a single-process run and on local rank 0 of a distributed one; the
# checkpoint in the `not args.distributed` arm runs only without DDP. Expects nothing.
import torch
import torch.distributed as dist


def main_process(args):
    return not args.multiprocessing_distributed or (
        args.multiprocessing_distributed and args.rank % args.ngpus_per_node == 0)


def train(args, model):
    if args.distributed:
        dist.init_process_group("nccl", rank=args.rank, world_size=args.world_size)
    for _epoch in range(args.epochs):
        if main_process(args):
            torch.save(model.state_dict(), "last.pth")
        if not args.distributed:
            torch.save(model.state_dict(), "single.pth")
    if args.distributed:
        dist.destroy_process_group()
