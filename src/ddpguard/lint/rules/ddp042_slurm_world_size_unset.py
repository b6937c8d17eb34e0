"""DDP042 a SLURM arm that takes the rank from SLURM_PROCID and leaves the world size at 1.

```python
def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:     # torchrun
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
    elif "SLURM_PROCID" in os.environ:                          # srun
        args.rank = int(os.environ["SLURM_PROCID"])
    dist.init_process_group("nccl", init_method=args.dist_url,
                            world_size=args.world_size, rank=args.rank)
```

A set-up function takes the rank from `SLURM_PROCID` in the arm that runs under `srun`
(beside a torchrun arm that reads `RANK` and `WORLD_SIZE`), and passes
`world_size=args.world_size`, whose option defaults to 1, with nothing in the project setting
it. Under `srun` every task but the first fails with rank >= world size, and task 0 forms a
group of one and trains alone on its share of the job. Not where anything else in the files
sets the world size before the set-up runs (submitit's trainer sets `args.world_size =
job_env.num_tasks`), or the arm leaves. Fix: set it in the same arm,
`args.world_size = int(os.environ["SLURM_NTASKS"])`.

In preview: the code is read right every time, but most programs that carry this DETR-style
set-up ship only torchrun launches, where the arm never runs (first findings, tuning data of
the seventeenth round: 9 debatable, 1 false, where a `run_with_submitit.py` not linted set the
world size; the first blind one debatable).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import Func, ModuleInfo, kwarg, option_names
from ..analysis.options import project
from ..analysis.provenance import dotted
from ..registry import Hit, rule


@rule('DDP042', 'slurm-world-size-unset', 'warning',
      'a SLURM arm sets the rank from SLURM_PROCID and leaves the world size at its default 1',
      'set the world size in the same arm from SLURM_NTASKS', preview=True)
def ddp042(info: ModuleInfo) -> Iterator[Hit]:
    yield from _slurm_arm(info)


def _slurm_arm(info: ModuleInfo) -> Iterator[Hit]:
    if "SLURM_PROCID" not in info.spelled:
        return
    for rec in info.calls_named("init_process_group"):
        func = rec.func
        world = dotted(kwarg(rec.node, "world_size") or ast.Constant(None))
        rank = dotted(kwarg(rec.node, "rank") or ast.Constant(None))
        if func is None or world is None or rank is None or "." not in world:
            continue
        for arm, chain in _arms(func):
            if arm.lineno > rec.node.lineno or not any(
                    isinstance(n, ast.Constant) and n.value == "SLURM_PROCID"
                    for n in ast.walk(arm.test)):
                continue
            if not _sets_from(arm.body, rank, "SLURM_PROCID") or _sets(arm.body, world) \
                    or any(isinstance(n, ast.Return | ast.Raise) for st in arm.body
                           for n in ast.walk(st)):
                continue
            if _set_elsewhere(info, func, chain, world, rec.node.lineno):
                continue
            default = _option_default(info, world.rsplit(".", 1)[-1])
            if default:
                yield arm, "DDP042", (
                    f"under srun this arm takes the rank from SLURM_PROCID but leaves "
                    f"`{world}` at {default}: init_process_group at line {rec.node.lineno} "
                    f"gets world_size=1, so every task but rank 0 fails (rank >= world size) "
                    f"and rank 0 forms a group of one and trains alone; set it in this arm "
                    f"from SLURM_NTASKS")
            break


def _arms(func: Func) -> Iterator[tuple[ast.If, ast.If]]:
    """Each `if`/`elif` arm of `func` with the first `if` of its chain."""
    inner: set[int] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.If) and id(node) not in inner:
            arm: ast.If | None = node
            while arm is not None:
                yield arm, node
                nxt = arm.orelse[0] if len(arm.orelse) == 1 else None
                arm = nxt if isinstance(nxt, ast.If) else None
                if arm is not None:
                    inner.add(id(arm))


def _targets(body: list[ast.stmt]) -> Iterator[tuple[str, ast.expr]]:
    for st in body:
        for n in ast.walk(st):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if (d := dotted(t)) is not None:
                        yield d, n.value


def _sets(body: list[ast.stmt], name: str) -> bool:
    return any(d == name for d, _ in _targets(body))


def _sets_from(body: list[ast.stmt], name: str, var: str) -> bool:
    return any(d == name and any(isinstance(n, ast.Constant) and n.value == var
                                 for n in ast.walk(v)) for d, v in _targets(body))


def _set_elsewhere(info: ModuleInfo, func: Func, chain: ast.If, world: str,
                   line: int) -> bool:
    """`world` set anywhere but in an arm of `chain` (the torchrun arm's WORLD_SIZE): in
    `func` before the group is formed, or where the set-up is called from (a function of the
    project that calls `func`, or the module level of a file that does): the caller sets it
    first; or submitit (whose trainer sets it) imported. Another entry that never calls the
    set-up has its own (pyconvmain.py beside main.py)."""
    end = chain.end_lineno or chain.lineno
    attr = world.rsplit(".", 1)[-1]
    infos = project(info)
    for other in infos:
        if any("submitit" in q for q in other.aliases.values()):
            return True
        for d, entries in other.assigns.items():
            if "." not in d or d.rsplit(".", 1)[-1] != attr:
                continue
            for at, value in entries:
                # `self.world_size = dist.get_world_size()` reads the group once it is formed.
                if isinstance(value, ast.Call) and other.callee_last(value) == "get_world_size":
                    continue
                if other is info and func.lineno <= at <= (func.end_lineno or at):
                    if at < line and not chain.lineno <= at <= end:
                        return True
                elif _in_a_caller(other, at, func.name):
                    return True
    return False


def _in_a_caller(info: ModuleInfo, line: int, name: str) -> bool:
    """Line `line` of `info` sits in a function that calls `name`, or at the module level of
    a file that calls it."""
    holders = [f for fs in info.funcs.values() for f in fs
               if f.lineno <= line <= (f.end_lineno or f.lineno)]
    if not holders:
        return bool(info.calls_named(name))
    inner = max(holders, key=lambda f: f.lineno)
    return any(isinstance(c, ast.Call) and info.callee_last(c) == name for c in ast.walk(inner))


def _option_default(info: ModuleInfo, attr: str) -> str:
    """'the option's default, 1 (main.py:40)' for `add_argument("--world_size", default=1)`
    in a file of the project; "" where none is seen or its default is anything else."""
    infos = project(info)
    for other in infos:
        for rec in other.calls_named("add_argument"):
            default = kwarg(rec.node, "default")
            if attr in option_names(rec.node):
                if isinstance(default, ast.Constant) and default.value == 1:
                    where = f"{other.path.rsplit('/', 1)[-1]}:{rec.node.lineno}"
                    return f"the option's default, 1 ({where})"
                return ""
    return ""


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import argparse
import os


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
    elif "SLURM_PROCID" in os.environ:
        args.rank = int(os.environ["SLURM_PROCID"])
    dist.init_process_group("nccl", init_method=args.dist_url,
                            world_size=args.world_size, rank=args.rank)


parser = argparse.ArgumentParser()
parser.add_argument("--world_size", default=1, type=int)
"""

RULE = ddp042
