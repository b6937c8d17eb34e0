# Our fixture (issue 20, round 4): the script wraps in DDP only `if ddp:` and saves
# `unet.module.state_dict()` in that mode, `unet.state_dict()` (the bare model) otherwise; the
# resume loads the bare model. A second model (the autoencoder) is loaded from its own file.
# Every checkpoint is readable by the script's own resume. Expects nothing.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args):
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if ddp:
        dist.init_process_group("nccl")
    rank = dist.get_rank() if ddp else 0
    device = torch.device(f"cuda:{rank}")
    autoencoder = torch.nn.Linear(8, 4).to(device)
    autoencoder.load_state_dict(torch.load(args.autoencoder, map_location=device))
    unet = torch.nn.Linear(4, 4).to(device)
    if args.resume:
        unet.load_state_dict(torch.load(args.unet, map_location=device))
    if ddp:
        unet = DDP(unet, device_ids=[device])
    for _ in range(args.epochs):
        unet(autoencoder(torch.randn(2, 8, device=device))).sum().backward()
        if rank == 0:
            if ddp:
                torch.save(unet.module.state_dict(), args.unet)
            else:
                torch.save(unet.state_dict(), args.unet)
    if ddp:
        dist.destroy_process_group()
