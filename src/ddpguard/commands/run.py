"""`ddpguard run`: launch a job with the hang guard (the launching itself lives in
ddpguard.launch, which the demo calls too)."""

from __future__ import annotations

NAME = "run"
HELP = "launch a job with the hang guard: a script through torchrun, or any command after --"
RAW = True

USAGE = """usage: ddpguard run [torchrun options] script.py [script args]
       ddpguard run [--stall-timeout S] [--no-guard] -- COMMAND [args]

The first form launches the script through torch.distributed.run. Defaults added when absent:
  --nproc-per-node  the number of visible GPUs, or 2 on a CPU-only machine
  --standalone      when no --nnodes/--rdzv-endpoint/--master-addr/--master-port is given
  --monitor-interval 1 (torchrun's is 0.1 s): surviving ranks get a second to say where they
                    wait before torchrun stops them after a rank died
All other options go to torchrun unchanged (see `torchrun --help`). A script that starts its
own ranks (torch.multiprocessing.spawn, start_processes, detectron2's launch) is run the
second way instead, with a note.

The second form runs COMMAND as it is: a script that spawns its ranks (`-- python train.py`),
`-- torchrun ...`, `-- python -m torch.distributed.launch ...`, `-- accelerate launch ...`, a
Lightning script (`-- python train.py`), or one srun task per rank (`srun ddpguard run --
python train.py`). Every Python process of its tree is guarded from the moment it forms a
process group (a sitecustomize on PYTHONPATH; no change to the script).

Guard options (both forms):
  --no-guard        run as is, without ddpguard's hang guard
  --stall-timeout S a hard limit: stop the job when any rank has waited S seconds in a
                    collective, even for a peer that is still working (default: no limit;
                    the guard stops on proof of a deadlock or after 45 s with no sign of life)

When the guard stops the job, this command prints its report once, at the end, and exits 17,
whatever the script did to its ranks' output. When torchrun restarts a stopped attempt
(--max-restarts) it says so in one line, and the exit code is the last attempt's: 0 when the
job recovered. In the first form each rank's stderr passes through a file (torchrun
--redirects 2, shown here as it is written) unless you pass --redirects, --tee or --log-dir
yourself: a rank that crashes inside native code is shown with its last words."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    from ddpguard.launch import main as launch

    return launch(argv)
