# Our fixture (issue 20): per-rank files. Each rank saves its own queue / memory bank to a
# path that contains its rank, and loads the same file back: no shared file, and the tensors
# go back to the device that saved them. Expects nothing.
import os

import torch
import torch.distributed as dist


def main(args):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(args.local_rank)
    queue = torch.zeros(128, 16).cuda()
    queue_path = os.path.join(args.dump_path, "queue" + str(args.rank) + ".pth")
    if os.path.isfile(queue_path):
        queue = torch.load(queue_path)["queue"]
    mb_path = os.path.join(args.dump_path, f"mb{rank}.pth")
    for _epoch in range(3):
        torch.save({"queue": queue}, queue_path)
        torch.save({"bank": queue.clone()}, mb_path)
        torch.save(queue, f"queue{rank}.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None)
