"""SLURM: one task per rank (`srun`), rank from SLURM_PROCID, rank 0's host from the node list."""

from __future__ import annotations

import re
from collections.abc import Mapping

from .environment import int_var
from .place import DEFAULT_PORT, World


def _first_count(spec: str, name: str) -> int:
    """SLURM writes per-node counts as '4', '4(x2)' or '4(x2),2'; the first node's count is ours
    only on homogeneous jobs, which is what DDP needs anyway."""
    m = re.match(r"\s*(\d+)", spec)
    if not m:
        raise ValueError(f"{name}={spec!r} is not a SLURM task count such as '4' or '4(x2)'")
    return int(m.group(1))


def _split_top_level(spec: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in node list {spec!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in node list {spec!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_range_list(body: str, spec: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if "-" in item:
            lo, hi = item.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {item!r} in node list {spec!r}")
            width = len(lo)  # keep zero padding: node[01-04] -> node01..node04
            out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
        elif item:
            out.append(item)
    return out


def expand_nodelist(spec: str) -> list[str]:
    """Expand a SLURM host list: 'node[01-04,07],gpu-a[1-2]-x' -> ['node01', ..., 'gpu-a2-x']."""
    hosts: list[str] = []
    for part in _split_top_level(spec):
        expansions = [""]
        pos = 0
        for m in re.finditer(r"\[([^\]]*)\]", part):
            prefix = part[pos : m.start()]
            choices = _expand_range_list(m.group(1), spec)
            expansions = [e + prefix + c for e in expansions for c in choices]
            pos = m.end()
        hosts.extend(e + part[pos:] for e in expansions)
    if not hosts:
        raise ValueError(f"node list {spec!r} names no host")
    return hosts


class SlurmEnvironment:
    name = "slurm"

    def detected(self, env: Mapping[str, str]) -> bool:
        # An interactive allocation (`salloc` then `python train.py`) is one process, not a
        # job step.
        return "SLURM_PROCID" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")

    def world(self, env: Mapping[str, str]) -> World:
        if "SLURM_NTASKS" not in env:
            raise ValueError(
                f"SLURM_PROCID={env['SLURM_PROCID']!r} is set but SLURM_NTASKS is not: start the "
                "job with srun (which sets both), or unset SLURM_PROCID"
            )
        rank = int_var(env, "SLURM_PROCID")
        world_size = int_var(env, "SLURM_NTASKS")
        if not 0 <= rank < world_size:
            raise ValueError(f"SLURM_PROCID={rank} is not below SLURM_NTASKS={world_size}")
        local_rank = int_var(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        per_node_var = next(
            (n for n in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if env.get(n)), None
        )
        local_world_size = (
            _first_count(env[per_node_var], per_node_var) if per_node_var else world_size
        )
        if not 0 <= local_rank < local_world_size:
            raise ValueError(
                f"SLURM_LOCALID={local_rank} is not below the {local_world_size} tasks per node "
                f"({per_node_var or 'SLURM_NTASKS'})"
            )
        addr = env.get("MASTER_ADDR")
        if not addr:
            nodelist_var = next(
                (n for n in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(n)), None
            )
            if nodelist_var is None:
                if world_size > 1:
                    raise ValueError(
                        "SLURM job with SLURM_NTASKS>1 but neither MASTER_ADDR nor "
                        "SLURM_JOB_NODELIST is set: cannot tell where rank 0 runs"
                    )
                addr = "127.0.0.1"
            else:
                addr = expand_nodelist(env[nodelist_var])[0]
        if env.get("MASTER_PORT"):
            port = int_var(env, "MASTER_PORT")
        elif env.get("SLURM_JOB_ID", "").isdigit():
            # Same on every task of the job, different between jobs sharing a node.
            port = 15000 + int(env["SLURM_JOB_ID"]) % 20000
        else:
            port = DEFAULT_PORT
        return World(rank, world_size, local_rank, local_world_size, addr, port, "slurm")
