# Our fixture (issue 20): the "leader goes first" context manager. Ranks with local_rank > 0
# call barrier() before the yield, local rank 0 after it: every rank calls exactly one
# barrier, so the schedules match. Expects nothing.
import os
from contextlib import contextmanager

import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])


@contextmanager
def leader_first(local_rank):
    if local_rank > 0:
        dist.barrier()
    yield
    if local_rank == 0:
        dist.barrier()


def build_dataset(path):
    # rank 0 downloads/caches first, the others then read
    with leader_first(local_rank), open(path) as fh:
        data = fh.read()
    dist.barrier()
    return data


if __name__ == "__main__":
    dist.init_process_group("nccl")
    build_dataset("data.txt")
    dist.destroy_process_group()
