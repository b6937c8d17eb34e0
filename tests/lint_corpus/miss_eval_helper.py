# Our fixture (issue 13): rank-0-only evaluation through the DDP wrapper, hidden in a helper
# that reads the module-level model (nanoGPT's estimate_loss pattern), here with gradients on:
# rank 0's extra forward syncs the buffers once more than the others ever do. (nanoGPT's own
# helper runs under no_grad: its one broadcast pairs with the others' next training forward
# and nothing hangs; issue 20's sixth round, measured on two gloo ranks by two reviewers.)
import os

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

init_process_group(backend="nccl")
ddp_rank = int(os.environ["RANK"])
ddp_local_rank = int(os.environ["LOCAL_RANK"])
master_process = ddp_rank == 0
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to(ddp_local_rank)
model = DDP(model, device_ids=[ddp_local_rank])


def estimate_loss():
    model.eval()
    out = model(torch.randn(4, 8)).mean()  # expect: DDP006
    model.train()
    return out


for it in range(1000):
    if it % 100 == 0 and master_process:
        print(estimate_loss())
    model(torch.randn(4, 8)).sum().backward()
destroy_process_group()
