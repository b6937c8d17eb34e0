# Our fixture (issue 20): rank provenance through a boolean flag. `master_process` comes from
# `ddp_rank == 0` (and is True in the single-process launch); the barrier under it is reached
# by rank 0 only.
import os

import torch.distributed as dist

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group("nccl")
    ddp_rank = int(os.environ["RANK"])
    master_process = ddp_rank == 0
else:
    master_process = True

for step in range(100):
    if step % 10 == 0 and master_process:
        dist.barrier()  # expect: DDP005
if ddp:
    dist.destroy_process_group()
