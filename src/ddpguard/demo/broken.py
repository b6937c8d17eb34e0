"""The demo's job written the way many DDP scripts are (plain torch: DistributedSampler,
DataLoader, DDP), with ONE classic bug switched on by --bug. `ddpguard demo --hang KIND`
copies this file next to its output and runs it under the hang guard, like `ddpguard run`
would, so the guard's report points at a line of a file you can open.

    python -m torch.distributed.run --standalone --nproc-per-node 2 broken_train.py \
        --bug rank0-collective --train TRAIN.jsonl --val VAL.jsonl

Bugs (each is explained in docs/pitfalls.md):
  uneven            rank 1 filters its shard, so it has fewer batches: ranks do different
                    numbers of steps and the extra steps' all-reduces have no partner
  rank0-collective  rank 0 saves a checkpoint, then calls barrier() inside its `if rank == 0:`
                    block: the other rank never joins
  crash             rank 1 raises on a bad record mid-epoch while rank 0 waits in all_reduce
  bn-eval           rank 0 evaluates a BatchNorm model through the DDP wrapper: the wrapper's
                    buffer broadcast waits for a rank that is training
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ddpguard.demo.net import ByteLM, collate, lm_loss

HERE = os.path.dirname(os.path.abspath(__file__))
BUGS = ("uneven", "rank0-collective", "crash", "bn-eval")

p = argparse.ArgumentParser()
p.add_argument("--bug", choices=BUGS, required=True)
p.add_argument("--train", required=True)
p.add_argument("--val", required=True)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--bug-step", type=int, default=3, help="the step at which the bug strikes")
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


train, val = records(args.train), records(args.val)
if args.bug == "uneven":
    # Shard by hand, then drop records that fail a check on this rank only (a filter, an
    # augmentation that rejects samples): rank 1 ends up with fewer batches than rank 0.
    shard = train[rank::world]
    if rank == 1:
        shard = [r for r in shard if "TODO" not in r["text"]][:-40]
    loader = DataLoader(shard, batch_size=16, collate_fn=collate)
else:
    sampler: DistributedSampler[dict] = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=16, sampler=sampler, collate_fn=collate)
val_batch = collate(val[:16])

net = ByteLM(d_model=64, n_layers=1, batch_norm=args.bug == "bn-eval")
model = DDP(net)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

# One pass when the shards are uneven: the short rank then leaves while the other still
# trains, which hangs. Over several epochs its next epoch's all-reduces would pair with the
# other's last ones instead, silently wrong (the guard's notice at the first step says so).
epochs = 1 if args.bug == "uneven" else args.epochs
for epoch in range(epochs):
    if args.bug != "uneven":
        sampler.set_epoch(epoch)
    for step, batch in enumerate(loader):
        if args.bug == "crash" and rank == 1 and epoch == 0 and step == args.bug_step:
            raise ValueError(f"bad record in batch {step}: a dying rank mid-epoch")
        values, counts = lm_loss(model, batch)
        loss = values.sum() / counts.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.bug == "rank0-collective" and rank == 0 and step == args.bug_step:
            torch.save(net.state_dict(), os.path.join(HERE, "broken_ckpt.pt"))
            dist.barrier()  # the BUG: only rank 0 gets here; the others never join
        if args.bug == "bn-eval" and rank == 0 and step == args.bug_step:
            model.eval()  # (no torch.no_grad(): as in many scripts; see docs/demo.md)
            lm_loss(model, val_batch)  # the BUG: a DDP forward on rank 0 only
            model.train()
    if rank == 0:
        print(f"epoch {epoch} done", flush=True)

dist.destroy_process_group()
