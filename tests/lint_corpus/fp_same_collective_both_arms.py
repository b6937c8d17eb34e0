# Our fixture (issue 20): the same collective in both arms of a rank test. gather() with a
# gather_list on the destination and without one elsewhere; a helper that all-reduces,
# called in both the `if rank == 0:` and the `else:` arm. Expects nothing.
import torch
import torch.distributed as dist


def collect(t, dst=0):
    if dist.get_rank() == dst:
        out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
        dist.gather(t, out, dst=dst)
        return torch.cat(out)
    dist.gather(t, dst=dst)
    return None


def train_and_evaluate(model, data):
    loss = model(data).sum()
    dist.all_reduce(loss)
    return loss


def main(rank, model, data):
    if rank == 0:
        print("starting")
        result = train_and_evaluate(model, data)
        print(result)
    else:
        result = train_and_evaluate(model, data)
    collect(result)
