# Our fixture (issue 13): a flag derived from the rank guards checkpointing, and a
# checkpoint serialized into memory is no shared file. Expects nothing.
import io
import os

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl")
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    master_process = ddp_rank == 0
    device = f"cuda:{ddp_local_rank}"
else:
    master_process = True
    device = "cpu"

model = torch.nn.Linear(4, 4).to(device)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model
buffer = io.BytesIO()
torch.save(raw_model.state_dict(), buffer)  # every rank, but only into its own memory
for it in range(100):
    loss = model(torch.randn(2, 4, device=device)).sum()
    loss.backward()
    if it % 10 == 0 and master_process:
        torch.save({"model": raw_model.state_dict(), "iter": it}, "ckpt.pt")
if ddp:
    destroy_process_group()
