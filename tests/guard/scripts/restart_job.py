"""A 2-rank job for `ddpguard run --max-restarts N`: what goes wrong depends on the attempt
(torchrun's restart count). --fail is a list, one word per attempt: 'stop' (rank 0 alone
all-reduces: the guard stops the attempt), 'crash' (rank 1 raises), 'ok'; attempts past the
list finish. The group is formed by ddpguard.init(): torch's own env:// set-up reuses the
agent store's keys across restarts, so a restarted gloo rank would dial a dead peer."""

import os
import sys

import torch
import torch.distributed as dist

import ddpguard as dg

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
plan = sys.argv[sys.argv.index("--fail") + 1].split(",")
what = plan[attempt] if attempt < len(plan) else "ok"
world = dg.init(backend="gloo")
rank = world.rank
t = torch.ones(2)
for _ in range(3):
    dist.all_reduce(t)
if what == "stop" and rank == 0:
    dist.all_reduce(t)  # the BUG: rank 0 only
if what == "crash" and rank == 1:
    raise RuntimeError(f"a failure on attempt {attempt}")
dist.barrier()
print(f"FINISHED attempt={attempt} rank={rank}", flush=True)
dg.shutdown(world)
