"""Loaders of different lengths on 2 gloo ranks (rank 0: 8 batches, rank 1: 6), one --case each
(several chain in one job: --case join_ddp,agree):

- join_ddp: torch's Join around the DDP loop; rank 0's last step is slow, so rank 1 sits in
  Join's shadow collectives for seconds.
- join_zero: Join with DDP and a ZeroRedundancyOptimizer (two joinables).
- join_custom: Join with a Joinable of the script's own (torch's documented Counter).
- agree: the ranks all_reduce "I still have a batch" each step and leave together; rank 1,
  once out, works for seconds before it says so while rank 0 waits in the agreement.

The guard must leave each of them running to the end (a plain loop over such shards is
scenarios.py's uneven_tail, which it must stop).

    ddpguard run --nproc-per-node 2 tests/guard/scripts/uneven_scenarios.py --case agree
"""

import argparse
import gc
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--case", required=True)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
BATCHES = 8 if rank == 0 else 6  # per-rank shards of different sizes
x = torch.randn(4 * BATCHES, 4, generator=torch.Generator().manual_seed(rank))
ds = TensorDataset(x, (x.sum(1, keepdim=True) > 0).float())
loss_fn = torch.nn.BCEWithLogitsLoss()


def busy(seconds):
    """Live work (a long step, closing files): many small ops through Python."""
    end = time.monotonic() + seconds
    a = torch.randn(32, 32)
    while time.monotonic() < end:
        a = torch.tanh(a @ a.T / 32)


def ddp_model():
    return DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))


def step(model, opt, xb, yb):
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()


def join_ddp():
    model = ddp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(ds, batch_size=4)  # join_ddp loader
    for _epoch in range(2):
        with Join([model]):
            for i, (xb, yb) in enumerate(loader):
                if i == BATCHES - 1 and rank == 0:
                    busy(2.5)  # the extra steps' rank is slow: rank 1 waits in Join's shadows
                step(model, opt, xb, yb)


def join_zero():
    model = ddp_model()
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    loader = DataLoader(ds, batch_size=4)  # join_zero loader
    with Join([model, opt]):
        for xb, yb in loader:
            step(model, opt, xb, yb)


class Counter(Joinable):
    """torch's Join tutorial: counts the inputs processed on every rank."""

    def __init__(self):
        super().__init__()
        self.count = torch.zeros(1)

    def __call__(self):
        Join.notify_join_context(self)
        t = torch.ones(1)
        dist.all_reduce(t)
        self.count += t

    def join_hook(self, **kwargs):
        return CounterJoinHook(self)

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return dist.group.WORLD


class CounterJoinHook(JoinHook):
    def __init__(self, counter):
        self.counter = counter

    def main_hook(self):
        dist.all_reduce(torch.zeros(1))  # shadows the count of a rank still counting

    def post_hook(self, is_last_joiner):
        dist.all_reduce(self.counter.count)


def join_custom():
    counter = Counter()
    loader = DataLoader(ds, batch_size=4)  # join_custom loader
    with Join([counter]):
        for _batch in loader:
            counter()


def agree():
    model = ddp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(ds, batch_size=4)  # agree loader
    it = iter(loader)
    while True:
        batch = next(it, None)
        if batch is None:
            busy(2.5)  # out of data: closes its files before telling the others
        have = torch.tensor([0.0 if batch is None else 1.0])
        dist.all_reduce(have, op=dist.ReduceOp.MIN)  # agree: every rank still has a batch?
        if have.item() == 0:
            break
        step(model, opt, *batch)


CASES = {"join_ddp": join_ddp, "join_zero": join_zero, "join_custom": join_custom, "agree": agree}
for case in args.case.split(","):
    CASES[case]()
    print(f"rank {rank}: phase {case} done", flush=True)
gc.collect()  # DDP reducers go while the interpreter is alive (pytorch/pytorch#179291)
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
