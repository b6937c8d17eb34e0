"""Smallest ddpguard script: every rank says hello, then they agree on a sum.

    python examples/hello.py                              # one process
    ddpguard run --nproc-per-node 2 examples/hello.py     # two ranks via torchrun
"""

import torch
import torch.distributed as dist

import ddpguard as dg


def main() -> None:
    world = dg.init()
    world.print(
        f"hello from rank {world.rank} of {world.world_size} ({world.launcher})", force=True
    )
    total = torch.tensor([world.rank + 1.0])
    if world.distributed:
        dist.all_reduce(total)
    world.print(f"sum of (rank + 1) over {world.world_size} ranks = {total.item():.0f}")
    dg.shutdown(world)


if __name__ == "__main__":
    main()
