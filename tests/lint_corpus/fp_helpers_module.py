# Our fixture (issue 13): a helper module. Its `continue` loops walk keyword arguments, not
# batches; it initializes the process group for a caller that owns the teardown; its
# torch.load forwards the caller's options. Expects nothing.
import os

import torch
import torch.distributed as dist


class MetricLogger:
    def __init__(self):
        self.meters = {}

    def update(self, **kwargs):
        for k, v in kwargs.items():
            if v is None:
                continue
            self.meters[k] = float(v)


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group("nccl", world_size=args.world_size, rank=args.rank)
    dist.barrier()


def load_state_dict(path, **kwargs):
    return torch.load(path, **kwargs)
