# Our fixture (issue 20): a resume path where rank 0 alone calls a helper that broadcasts
# inside; every multi-GPU resume hangs (the other ranks never enter the broadcast).
import os

import torch
import torch.distributed as dist


def load_checkpoint(model, path):
    state = torch.load(path, map_location="cpu") if dist.get_rank() == 0 else None
    objs = [state]
    dist.broadcast_object_list(objs, src=0)
    model.load_state_dict(objs[0])


def main(args, model):
    dist.init_process_group("nccl")
    if args.resume and dist.get_rank() == 0:
        load_checkpoint(model, args.resume)  # expect: DDP005
    for _step in range(10):
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None, None)
    os.environ.get("RANK")
