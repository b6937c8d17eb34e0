"""A tiny DDP job started the way `--launch` says, for the launcher tests of `ddpguard run`:

- spawn: torch.multiprocessing.spawn inside main(), the group formed with init_method tcp://
- env:   one process per rank started by a launcher that sets RANK/WORLD_SIZE (torchrun,
         `python -m torch.distributed.launch`, which also passes --local-rank)
- slurm: one process per SLURM task, rank and size from SLURM_PROCID / SLURM_NTASKS
- process: one multiprocessing.Process per rank inside main(), joined and its exit code never
           checked (the program exits 0 whatever its ranks did)
With --bug, rank 0 alone issues one more all_reduce (the line marked 'the BUG'); with --abort,
rank 0 alone all_reduces one number where rank 1 all_reduces 256: gloo aborts rank 0 (the line
marked 'the ABORT'), the rank that hosts the store under spawn (--aborted 1: rank 1 instead).
--early-stop (spawn): rank 0 alone leaves the epoch loop on its own patience (the line marked
'the EARLY STOP') and its spawned function returns (no destroy, no exit: its frame is gone)
while rank 1 waits in the next epoch's batch loop; with --agreed the stop is broadcast from
rank 0 first, so both ranks leave together.
--os-exit (spawn): rank 1 alone calls os._exit(1) after its all-reduces (the line marked
'the OS EXIT'): no atexit, and mp.spawn kills rank 0 at once on the nonzero code.
--raise-join (spawn): rank 1 raises inside a DDP Join context (the line marked 'the RAISE');
on its way out the Join's exit issues its collectives, which pair with rank 0's training ones.
--leave (slurm): rank 0 alone calls sys.exit(0) after its all-reduces (the line marked
'the LEAVE'), while rank 1 goes on to the barrier.
--finally-destroy (slurm): the group is destroyed in a `finally` while the error propagates;
with --fail rank 1 raises its own error there (the line marked 'the FAIL').
--sync-file PATH (slurm): the group forms through init_method='file://PATH' (a FileStore on a
shared file system, as many SLURM scripts do) instead of tcp://.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def body(rank: int, bug: bool, abort: bool = False, aborted: int = 0,
         destroy: bool = True, fail: bool = False, leave: bool = False,
         os_exit: bool = False) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if os_exit and rank == 1:
        os._exit(1)  # the OS EXIT: rank 1 alone
    if leave and rank == 0:
        sys.exit(0)  # the LEAVE: rank 0 alone, its launcher would see exit 0
    if bug and rank == 0:
        dist.all_reduce(t)  # the BUG: rank 0 only
    if abort and rank == aborted:
        dist.all_reduce(torch.ones(1))  # the ABORT: that rank only, one number
    if abort:
        dist.all_reduce(torch.ones(256))
    if fail and rank == 1:
        raise ValueError("malformed batch on rank 1")  # the FAIL: rank 1's own error
    dist.barrier()
    print(f"rank {rank} finished", flush=True)
    if destroy:
        dist.destroy_process_group()


def spawned_epochs(rank: int, world: int, port: int, agreed: bool) -> None:
    # The loop is the spawned function's own, as in many research scripts: when rank 0
    # returns, nothing of its stack is left to say where it left the loop.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    t = torch.ones(4)
    patience = 2
    for _epoch in range(4):
        for _ in range(3):
            dist.all_reduce(t)
        patience -= 1
        if agreed:
            stop = torch.tensor([int(rank == 0 and patience == 0)])
            dist.broadcast(stop, 0)
            if stop.item():
                break
        elif rank == 0 and patience == 0:
            break  # the EARLY STOP: rank 0 alone
    print(f"rank {rank} finished", flush=True)


def join_body(rank: int) -> None:
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        with Join([model]):
            for step in range(40):
                loss = model(torch.randn(4, 8)).pow(2).mean()
                if rank == 1 and step == 10:
                    raise ValueError("corrupt batch on rank 1")  # the RAISE
                loss.backward()
                opt.step()
    finally:
        dist.barrier()


def guarded_body(rank: int, a: argparse.Namespace) -> None:
    """--finally-destroy: the loop in try/except/finally as real programs write it, the
    group destroyed while the error propagates."""
    if not a.finally_destroy:
        body(rank, a.bug, a.abort, a.aborted, leave=a.leave)
        return
    try:
        body(rank, a.bug, a.abort, a.aborted, destroy=False, fail=a.fail)
    except Exception as exc:
        print(f"training failed: {exc}", flush=True)
        raise
    finally:
        dist.destroy_process_group()


def spawned(rank: int, world: int, port: int, bug: bool, abort: bool,
            early_stop: str = "", os_exit: bool = False) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    if early_stop == "raise-join":
        join_body(rank)
    else:
        body(rank, bug, abort, os_exit=os_exit)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--launch", choices=["spawn", "env", "slurm", "process"], required=True)
    p.add_argument("--bug", action="store_true")
    p.add_argument("--abort", action="store_true")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--local-rank", "--local_rank", type=int, default=None)
    p.add_argument("--aborted", type=int, default=0, help="the rank gloo aborts (--abort)")
    p.add_argument("--finally-destroy", action="store_true")
    p.add_argument("--fail", action="store_true", help="rank 1 raises (--finally-destroy)")
    p.add_argument("--early-stop", action="store_true")
    p.add_argument("--leave", action="store_true", help="rank 0 exits early (slurm)")
    p.add_argument("--os-exit", action="store_true", help="rank 1 calls os._exit(1) (spawn)")
    p.add_argument("--raise-join", action="store_true", help="rank 1 raises in Join (spawn)")
    p.add_argument("--agreed", action="store_true", help="the stop is broadcast (--early-stop)")
    p.add_argument("--sync-file", default="", help="init_method file://PATH (slurm)")
    a = p.parse_args()
    if a.launch == "spawn":
        stop = ("agreed" if a.agreed else "alone") if a.early_stop else ""
        stop = "raise-join" if a.raise_join else stop
        if a.early_stop:
            mp.spawn(spawned_epochs, args=(2, a.port, a.agreed), nprocs=2)
        else:
            mp.spawn(spawned, args=(2, a.port, a.bug, a.abort, stop, a.os_exit), nprocs=2)
    elif a.launch == "process":
        ranks = [mp.get_context("spawn").Process(target=spawned, args=(r, 2, a.port, a.bug,
                                                                       a.abort))
                 for r in range(2)]
        for proc in ranks:
            proc.start()
        for proc in ranks:
            proc.join()
    elif a.launch == "env":
        dist.init_process_group("gloo")
        body(dist.get_rank(), a.bug, a.abort)
    else:
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        init = f"file://{a.sync_file}" if a.sync_file else f"tcp://127.0.0.1:{a.port}"
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        guarded_body(rank, a)
    print("JOB DONE", flush=True)


if __name__ == "__main__":
    main()
