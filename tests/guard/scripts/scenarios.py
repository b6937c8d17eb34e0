"""Healthy and broken DDP programs for the hang guard, one per --case, on 2+ gloo ranks.

    ddpguard run --nproc-per-node 2 tests/guard/scripts/scenarios.py --case CASE --dur 8

Healthy cases do long but live work on one rank while the others wait (the guard must leave
them running); broken ones hang, desync or crash (the guard must stop them and say why).
`--dur` is the length of the long work, so tests use seconds and the benchmark minutes.
"""

import argparse
import gc
import os
import random
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--case", required=True)
p.add_argument("--dur", type=float, default=8.0)
p.add_argument("--steps", type=int, default=6)
args = p.parse_args()
# Several compatible healthy cases can run in one job: --case a,b,c
cases, dur = set(args.case.split(",")), args.dur

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
N = 64
x = torch.randn(N, 4, generator=torch.Generator().manual_seed(1))
y = (x.sum(1, keepdim=True) > 0).float()
ds = TensorDataset(x, y)


def busy(seconds):
    """Live work: many small ops through Python functions (what a compile or a long forward
    looks like from outside)."""
    end = time.monotonic() + seconds
    a = torch.randn(64, 64)
    while time.monotonic() < end:
        a = torch.tanh(a @ a.T / 64)
    return a


def write_slowly(seconds):
    """A checkpoint written in chunks to a slow disk."""
    end = time.monotonic() + seconds
    with tempfile.TemporaryFile() as fh:
        while time.monotonic() < end:
            fh.write(os.urandom(1 << 16))
            fh.flush()
            time.sleep(0.05)


class SlowFirst(torch.utils.data.Dataset):
    """Item 0 comes from slow remote storage: bytes trickle in for `dur` seconds."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        if i == SLOW_INDEX and rank == 1:
            end = time.monotonic() + dur
            with open(__file__, "rb") as fh:
                while time.monotonic() < end:
                    fh.seek(0)
                    fh.read(4096)
                    time.sleep(0.05)
            done("slow_first_batch")
        return ds[i]


class Hang(torch.utils.data.Dataset):
    """A worker that deadlocks on one item (a lock never released)."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        if rank == 1 and i == HANG_INDEX:
            import threading

            lock = threading.Lock()
            lock.acquire()
            lock.acquire()
        return ds[i]


bn = bool(cases & {"eval_rank0_bn", "desync_broadcast"})
layers = [torch.nn.Linear(4, 8)] + ([torch.nn.BatchNorm1d(8)] if bn else []) + \
         [torch.nn.ReLU(), torch.nn.Linear(8, 1)]
net = torch.nn.Sequential(*layers)
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.BCEWithLogitsLoss()

data = ds
if "slow_first_batch" in cases:
    data = SlowFirst()
elif "loader_worker_deadlock" in cases:
    data = Hang()
if "uneven_tail" in cases:
    idx = list(range(rank, N, world))
    data, sampler = Subset(ds, idx[4:] if rank == 1 else idx), None
else:
    sampler = DistributedSampler(data, shuffle=True, seed=0)
SLOW_INDEX = list(iter(sampler))[0] if sampler is not None else 0
HANG_INDEX = SLOW_INDEX
loader = DataLoader(data, batch_size=4, sampler=sampler, drop_last=True,
                    num_workers=1 if "loader_worker_deadlock" in cases else 0)


def done(phase):
    print(f"rank {rank}: phase {phase} done", flush=True)


def run_epoch(dl, train=True, limit=None):
    """The training loop's helper, also (rightly) used for rank-0 validation below."""
    total = 0.0
    for i, (xb, yb) in enumerate(dl):
        if limit is not None and i >= limit:
            break
        if train:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        else:
            with torch.no_grad():
                loss = loss_fn(net(xb), yb)
        total += loss.item()
    return total


def train_step(step, xb, yb):
    opt.zero_grad()
    if "slow_first_step" in cases and step == 0 and rank == 1:
        busy(dur)  # compile / warm-up in the first forward
        done("slow_first_step")
    out = model(xb)
    loss = loss_fn(out, yb)
    if "slow_first_backward" in cases and step == 0 and rank == 1:
        loss = SlowBackward.apply(loss)
    loss.backward()
    opt.step()
    if "step_spike" in cases and step == 3 and rank == 0:
        busy(dur)
        done("step_spike")
    if "random_step_times" in cases:
        time.sleep(random.Random(step * 7 + rank).uniform(0.0, 0.3))


class SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        busy(dur)
        done("slow_first_backward")
        return g


def estimate_loss():
    """nanoGPT's estimate_loss: evaluation through the DDP wrapper on the master process."""
    model.eval()
    end = time.monotonic() + dur
    with torch.no_grad():
        while time.monotonic() < end:
            for xb, yb in loader:
                loss_fn(model(xb), yb)
    model.train()


# -- broken before the first step ------------------------------------------------------------
if "mismatch_before_training" in cases:
    if rank == 0:
        dist.barrier()
    else:
        dist.all_reduce(torch.ones(3))
if "mismatch_sizes" in cases:
    dist.all_reduce(torch.ones(4 if rank == 0 else 5))

step = 0
for epoch in range(2):
    if sampler is not None:
        sampler.set_epoch(epoch)
    for i, (xb, yb) in enumerate(loader):
        if "early_exit" in cases and rank == 1 and epoch == 1 and i == 2:
            dist.destroy_process_group()
            sys.exit(0)
        if "crash" in cases and rank == 1 and epoch == 1 and i == 2:
            raise ValueError("bad record in shard 7")
        if "sigkill" in cases and rank == 1 and epoch == 1 and i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        if "infinite_loop" in cases and rank == 1 and epoch == 1 and i == 2:
            n = 0
            while True:
                n += 1
        if "frozen" in cases and rank == 1 and epoch == 1 and i == 2:
            import ctypes

            ctypes.PyDLL(None).sleep(600)  # a C call that never releases the GIL
        if "blocked_read" in cases and rank == 1 and epoch == 1 and i == 2:
            r, _w = os.pipe()
            os.read(r, 1)  # nobody ever writes
        train_step(step, xb, yb)
        step += 1
        if "nanogpt_eval" in cases and step == 2 and rank == 0:
            estimate_loss()  # no buffers: no collective in the DDP forward
            done("nanogpt_eval")
        if "eval_rank0_bn" in cases and step == 2 and rank == 0:
            model.eval()
            model(x[:8])  # validation through DDP, grad on: buffers broadcast from rank 0 only
            model.train()
        if "desync_broadcast" in cases and step == 2:
            if rank == 0:
                model.eval()
                model(x[:8])  # DDP's buffer broadcast ...
                model.train()
            else:
                state = torch.zeros(5056, dtype=torch.uint8)
                dist.broadcast(state, src=0)  # ... pairs with this one (an RNG-state sync)
                torch.set_rng_state(state)
    if "ckpt_barrier" in cases and epoch == 0:
        if rank == 0:
            write_slowly(dur)
            done("ckpt_barrier")
        dist.barrier()
    if "accelerate_wait" in cases and epoch == 0:
        if rank == 0:  # main process saves, then wait_for_everyone()
            end = time.monotonic() + dur
            while time.monotonic() < end:
                torch.save(net.state_dict(), os.devnull)
                busy(0.2)
            done("accelerate_wait")
        dist.barrier()
    if "rank0_eval_tensors" in cases and epoch == 0 and rank == 0:
        busy(dur)  # evaluation on plain tensors through the unwrapped module
        done("rank0_eval_tensors")
    if "rank0_eval_loader" in cases and epoch == 0 and rank == 0:
        end = time.monotonic() + dur
        while time.monotonic() < end:
            run_epoch(loader, train=False)
        done("rank0_eval_loader")
    if "val_same_helper" in cases and rank == 0:
        val = DataLoader(Subset(ds, range(16)), batch_size=4)
        run_epoch(val, train=False)  # same `for` line as training, a different loader
        done("val_same_helper")
    if "cond_barrier" in cases and rank == 0:
        dist.barrier()  # only rank 0 gets here

if "final_ckpt_after_exit" in cases:
    if rank == 0:
        write_slowly(dur)
        done("final_ckpt_after_exit")
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)
    sys.exit(0)
if "uneven_tail" in cases:
    pass
print(f"rank {rank} done at step {step}", flush=True)
# Drop the DDP wrapper (its reducer holds gloo work and gradient buckets) while the
# interpreter is alive: left to interpreter shutdown, gloo can abort the process at exit
# ("terminate called without an active exception", SIGABRT; pytorch/pytorch#179291).
model = None
gc.collect()
dist.destroy_process_group()
