# Our fixture (issue 20, second round): a reduced tensor passed to a method that returns at
# once on every rank but the destination, before it reads the sum. Expects nothing; the same
# helper without its early return reads the sum on every rank (see test_lint_round2).
import torch
import torch.distributed as dist


def is_main():
    return dist.get_rank() == 0


class Evaluator:
    def evaluate(self, model, loader):
        n = 0
        for x in loader:
            model(x)
            n += len(x)
        stats = torch.tensor([float(n)])
        dist.reduce(stats, dst=0)
        return self.summarize(stats)

    def summarize(self, stats):
        if not is_main():
            return None
        return stats[0].item()
