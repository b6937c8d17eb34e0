# ruff: noqa: SIM102, SIM223  (the dead branch written as TinyCLIP wrote it is the point)
# Our fixture (issue 20, sixth round): code on the DDP path that a distributed run never
# takes, or cannot be proven to take alike. A tool that refuses DDP (`assert not
# args.distributed`) and then saves; a logger whose rank-0 branch holds a stub for code left
# out (`raise NotImplementedError`) and a branch switched off (`if False and ...`); a search
# whose memoised scorer may gather or answer from its cache. Expects nothing.
import argparse
import functools

import torch
import torch.distributed as dist


def fit_scales(model, out):
    torch.save({k: v for k, v in model.state_dict().items() if "scale" in k}, out)


class Logger:
    def __init__(self, rank, arch_search):
        self.rank, self.arch_search = rank, arch_search

    def max_memory(self):
        mem = torch.tensor([torch.cuda.max_memory_allocated()])
        dist.all_reduce(mem, op=dist.ReduceOp.MAX)
        return mem.item()

    def log(self, stats, path):
        if self.arch_search and self.rank == 0:
            raise NotImplementedError("the search code is not released")
        if self.rank == 0:
            if False and path.exists():
                return -1
        stats["memory"] = self.max_memory()
        return stats


def search(sample, lo, hi):
    @functools.cache
    def score(p):
        preds = sample(p)
        out = [torch.zeros_like(preds) for _ in range(dist.get_world_size())]
        dist.all_gather(out, preds)
        return torch.cat(out).mean().item()

    while hi - lo > 2:
        m = (lo + hi) // 2
        if score(m) < score(m + 1):
            hi = m + 1
        else:
            lo = m
    best = lo
    if dist.get_rank() == 0:
        print("best", best, score(best))
    return best


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--distributed", action="store_true")
    parser.add_argument("--out", default="scales.pt")
    args = parser.parse_args()
    assert not args.distributed, "this tool does not work with DDP"
    fit_scales(torch.nn.Linear(2, 2), args.out)
