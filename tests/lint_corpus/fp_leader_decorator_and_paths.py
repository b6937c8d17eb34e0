# Our fixture (issue 20, sixth round): a trainer whose checkpoint method runs on the leader
# alone through a decorator; whose best-model writer takes its path from the caller (one file
# per rank when the model is sharded, behind a flag the file cannot read); whose gather helper
# asserts what it has just built on rank 0 (an invariant, not a failure one rank can meet
# alone). Expects nothing with the default rules.
import functools
import os

import torch
import torch.distributed as dist


def main_process(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if dist.get_rank() == 0:
            return fn(*args, **kwargs)
        return None
    return wrapper


class Trainer:
    def __init__(self, model, out_dir, sharded, primary):
        self.model, self.out_dir, self.sharded = model, out_dir, sharded
        self.rank = dist.get_rank()
        self.primary = primary

    @main_process
    def save_checkpoint(self, epoch):
        torch.save(self.model.state_dict(), os.path.join(self.out_dir, f"ckpt_{epoch}.pt"))

    def save_best(self):
        if self.sharded:
            self.best_path = os.path.join(self.out_dir, f"best_w{self.rank}.th")
            should_save = True
        else:
            self.best_path = os.path.join(self.out_dir, "best.th")
            should_save = self.primary
        if should_save:
            self._write(self.best_path)

    def _write(self, path):
        torch.save(self.model.state_dict(), path)

    def gather_queries(self, queries):
        world = dist.get_world_size()
        gathered = None
        if self.rank == 0:
            gathered = [torch.empty_like(queries) for _ in range(world)]
        dist.gather(queries, gathered, dst=0)
        if self.rank == 0:
            assert len(gathered) == world
            out = torch.cat(gathered).sum(0, keepdim=True)
        else:
            out = torch.empty_like(queries[:1])
        dist.broadcast(out, 0)
        return out

    def fit(self, epochs, queries):
        for epoch in range(epochs):
            self.gather_queries(queries)
            self.save_checkpoint(epoch)
            self.save_best()


def main(model, queries, out_dir, sharded, primary):
    dist.init_process_group("nccl")
    Trainer(model, out_dir, sharded, primary).fit(10, queries)
