"""Start a test script's ranks as forks of one process that has imported torch once.

    ddpguard run -- python tests/guard/scripts/forkrun.py SCRIPT [ARGS...]

The guard's job tests start about a hundred two-rank jobs. Under torchrun each job imports
torch three times (the agent and each rank), about 2.4 s of CPU each on a CI core; that was
most of the suite's time. Here torch is imported once and the ranks are forked by
torch.multiprocessing's own launcher (start_processes with the fork method), which is how
many real programs start their ranks: the guard is still tested through a real launcher,
the one of issue 33's mp.spawn row. Each rank gets the variables torchrun would set, so the
scripts form their group with env:// exactly as under torchrun.

FORKRUN_NPROC sets the number of ranks (2 by default).
"""

from __future__ import annotations

import os
import runpy
import socket
import sys

import torch  # noqa: F401  imported once, before the fork, for every rank
import torch.distributed  # noqa: F401
import torch.multiprocessing as mp
import torch.nn.parallel  # noqa: F401
import torch.utils.data  # noqa: F401


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, script: str, argv: list[str]) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    sys.argv = [script, *argv]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: forkrun.py SCRIPT [ARGS...]")
    world = int(os.environ.get("FORKRUN_NPROC", "2"))
    port = int(os.environ.get("MASTER_PORT") or _free_port())
    mp.start_processes(_rank, args=(world, port, sys.argv[1], sys.argv[2:]), nprocs=world,
                       start_method="fork")


if __name__ == "__main__":
    main()
