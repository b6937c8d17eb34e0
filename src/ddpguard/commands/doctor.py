"""`ddpguard doctor`: one screen to paste into a bug report."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
from collections.abc import Mapping

NAME = "doctor"
HELP = "print versions, backends, GPUs, distributed variables and what ddpguard would decide"

# Prefixes of variables that change how a distributed job forms or fails.
_PREFIXES = ("TORCH_NCCL_", "NCCL_", "TORCH_DISTRIBUTED_", "TORCHELASTIC_", "GLOO_", "SLURM_",
             "TORCH_FR_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
           "GROUP_RANK", "ROLE_RANK")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-topology", action="store_true",
                        help="skip `nvidia-smi topo -m` even when GPUs are present")


def distributed_variables(env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(name, value, remark) for every distributed-relevant variable set. Pure."""
    from ..world import DEPRECATED_VARIABLES, NONEXISTENT_VARIABLES

    rows = []
    for name in sorted(env):
        if name in _LAUNCH or name.startswith(_PREFIXES):
            remark = ""
            if name in DEPRECATED_VARIABLES:
                remark = f"DEPRECATED: use {DEPRECATED_VARIABLES[name]}"
            elif name in NONEXISTENT_VARIABLES:
                remark = f"DOES NOT EXIST: {NONEXISTENT_VARIABLES[name]}"
            rows.append((name, env[name], remark))
    return rows


def report(env: Mapping[str, str], *, topology: bool = True) -> str:
    import torch
    import torch.distributed as dist

    from .. import __version__
    from ..world import detect

    lines = [f"ddpguard {__version__}  python {platform.python_version()}  "
             f"{platform.system()} {platform.release()} {platform.machine()}"]
    lines.append(f"torch {torch.__version__}  (CUDA build: {torch.version.cuda or 'none'})")
    nccl = "n/a"
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception as exc:  # reported, not fatal: this is a diagnostic screen
            nccl = f"error: {exc}"
    lines.append(f"NCCL {nccl}")
    backends = {
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": dist.is_available() and dist.is_nccl_available(),
        "mpi": dist.is_available() and dist.is_mpi_available(),
    }
    lines.append(
        "backends: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in backends.items())
    )
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lines.append(f"GPUs: {n}")
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        lines.append(f"  cuda:{i} {p.name}  {p.total_memory / 2**30:.1f} GiB  "
                     f"sm_{p.major}{p.minor}")
    if n > 1 and topology:
        try:
            out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                 timeout=10).stdout
            lines.append("topology (nvidia-smi topo -m):")
            lines.extend("  " + ln for ln in out.splitlines())
        except (OSError, subprocess.TimeoutExpired) as exc:
            lines.append(f"topology: unavailable ({exc})")
    rows = distributed_variables(env)
    lines.append("distributed variables:" + ("" if rows else " none set"))
    for name, value, remark in rows:
        lines.append(f"  {name}={value}" + (f"   <- {remark}" if remark else ""))
    try:
        w = detect(env)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        lines.append(f"ddpguard would run as: {w.describe()}, backend {backend}")
    except ValueError as exc:
        lines.append(f"ddpguard would refuse to start: {exc}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    print(report(os.environ, topology=not args.no_topology))
    return 0
