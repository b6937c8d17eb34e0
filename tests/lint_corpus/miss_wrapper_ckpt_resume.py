# Our fixture (issue 20): the checkpoint holds the DDP wrapper's state_dict (keys `module.*`),
# and the script's own --resume loads it into the model before wrapping, strictly: every
# resume fails with missing/unexpected keys.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    model = torch.nn.Linear(4, 4).cuda(local_rank)
    if args.resume:
        ckpt = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(ckpt["model"])
    model = DDP(model, device_ids=[local_rank])
    for epoch in range(args.epochs):
        model(torch.randn(2, 4, device=local_rank)).sum().backward()
        if dist.get_rank() == 0:
            torch.save({"model": model.state_dict(), "epoch": epoch}, "ckpt.pt")  # expect: DDP008
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None)
