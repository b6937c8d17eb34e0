"""A DDP job that silences its own output the way real training scripts do, then breaks.

    ddpguard run --nproc-per-node 2 tests/guard/scripts/verdict_job.py --case CASE \
        --silence 0:print+streams,1:fd2+logging

--silence RANK:WAYS,...  per rank, any of: print (builtins.print replaced by `def p(*a)`, as
DINO/MoCo's setup_for_distributed does), streams (sys.stdout = sys.stderr = /dev/null), fd2
(os.dup2 of /dev/null onto fd 2), logging (logging.disable()).
--case: mismatch | crash | stall | uneven | abort | healthy.  --init: ddpguard.init() (no launcher).
"""

import argparse
import builtins
import logging
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

ap = argparse.ArgumentParser()
ap.add_argument("--case", required=True)
ap.add_argument("--silence", default="")
ap.add_argument("--init", action="store_true")
args = ap.parse_args()

if args.init:
    import ddpguard

    ddpguard.init(backend="gloo")
else:
    dist.init_process_group("gloo")
rank = dist.get_rank()


def p(*a):  # DINO's replacement: no `file=`, no `flush=`
    pass


ways = dict(item.split(":") for item in args.silence.split(",") if item)
how = ways.get(str(rank), "")
if "print" in how:
    builtins.print = p
if "streams" in how:
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (what scripts do)
if "fd2" in how:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
if "logging" in how:
    logging.disable()

t = torch.ones(8)
for _step in range(3):
    dist.all_reduce(t)  # a few healthy steps first

if args.case == "mismatch":
    if rank == 0:
        dist.barrier()  # verdict: rank 0 only
    else:
        dist.all_reduce(torch.ones(3))  # verdict: rank 1 only
elif args.case == "crash":
    if rank == 1:
        raise ValueError("bad record in shard 7")
    dist.all_reduce(t)  # verdict: rank 0 waits for the crashed rank
elif args.case == "stall":
    if rank == 1:
        n = 0
        while True:  # verdict: endless loop
            n += 1
    dist.all_reduce(t)  # verdict: rank 0 waits for the looping rank
elif args.case == "abort":
    dist.all_reduce(torch.ones(4 if rank == 0 else 5))  # gloo aborts the process
elif args.case == "uneven":
    loader = DataLoader(list(range(8 if rank == 0 else 6)), batch_size=2)
    for _batch in loader:  # verdict: uneven loader
        dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
