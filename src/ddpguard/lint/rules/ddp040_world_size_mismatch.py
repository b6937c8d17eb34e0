"""DDP040 the group is formed with a world size that is not the number of processes started.

`init_process_group` waits until `world_size` processes have joined. Two ways a program states
a count that its own launch does not start:

```python
def train(rank):
    dist.init_process_group("nccl", init_method="tcp://localhost:34567",
                            world_size=8, rank=rank)
    ...

if __name__ == "__main__":
    mp.spawn(train, nprocs=torch.cuda.device_count())
```

- **A literal world size beside a spawn that counts something else.** The function
  `mp.spawn` starts (or one it calls) forms the group with `world_size=<literal>`, while the
  spawn's `nprocs` is another literal or the machine's GPU count (`torch.cuda.device_count()`,
  directly or through a name). With fewer processes than the literal, every process waits in
  the rendezvous for ranks that never start, until the timeout; with more, the ranks past it
  fail. Fix: pass the count you spawn (`world_size=nprocs`) to every process.
- **A SLURM arm that sets the rank and not the world size.** A set-up function takes the rank
  from `SLURM_PROCID` in the arm that runs under `srun` (beside a torchrun arm that reads
  `RANK` and `WORLD_SIZE`), and passes `world_size=args.world_size`, whose option defaults to
  1, with nothing in the project setting it. Under `srun` every task but the first fails with
  rank >= world size, and task 0 forms a group of one and trains alone on its share of the
  job. Not where anything else in the files sets the world size (submitit's trainer sets
  `args.world_size = job_env.num_tasks`) or the arm leaves. Fix: set it in the same arm,
  `args.world_size = int(os.environ["SLURM_NTASKS"])`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import Func, ModuleInfo, kwarg
from ..analysis.provenance import dotted
from ..registry import Hit, rule


@rule('DDP040', 'world-size-mismatch', 'error',
      'the group is formed with a world size that is not the number of processes started',
      'pass the count of processes you start as the world size (under srun, SLURM_NTASKS)')
def ddp040(info: ModuleInfo) -> Iterator[Hit]:
    yield from _spawned_literal(info)
    yield from _slurm_arm(info)


def _spawned_literal(info: ModuleInfo) -> Iterator[Hit]:
    for rec in info.calls_named("init_process_group"):
        ws = kwarg(rec.node, "world_size")
        if rec.func is None or not (isinstance(ws, ast.Constant) and type(ws.value) is int
                                    and ws.value > 1):
            continue
        for spawn in info.calls_named("spawn", "start_processes"):
            if not _starts(info, spawn.node, rec.func):
                continue
            count = _nprocs(info, spawn.node, spawn.func)
            if count and count != str(ws.value):
                yield ws, "DDP040", (
                    f"init_process_group(world_size={ws.value}) at line {rec.node.lineno}, but "
                    f"the spawn at line {spawn.node.lineno} starts {count} processes: with "
                    f"fewer than {ws.value}, every process waits in the rendezvous for ranks "
                    f"that never start, until the timeout; with more, the ranks past "
                    f"{ws.value - 1} fail; pass the count you spawn as the world size")
                break


def _starts(info: ModuleInfo, call: ast.Call, target: Func) -> bool:
    """`mp.spawn(target, ...)`, or a spawn of a function of this file that calls `target`."""
    if not call.args or not (info.qualify(call.func) or "").endswith(
            ("multiprocessing.spawn", "multiprocessing.start_processes", "mp.spawn")):
        return False
    name = dotted(call.args[0])
    started = name.rsplit(".", 1)[-1] if name else ""
    if started == target.name:
        return True
    return any(isinstance(c, ast.Call) and info.callee_last(c) == target.name
               for fn in info.funcs.get(started, []) for c in ast.walk(fn))


def _nprocs(info: ModuleInfo, call: ast.Call, func: Func | None) -> str:
    """What the spawn's `nprocs` counts, as the message names it: another literal, or the
    GPUs the machine shows; "" where it is anything else (a world size passed on)."""
    n = kwarg(call, "nprocs")
    if n is None and len(call.args) > 2:
        n = call.args[2]
    if isinstance(n, ast.Constant) and type(n.value) is int:
        return str(n.value)
    if isinstance(n, ast.Call) and info.callee_last(n) == "device_count":
        return "torch.cuda.device_count()"
    if isinstance(n, ast.Name) and func is not None:
        values = [st.value for st in ast.walk(func) if isinstance(st, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == n.id for t in st.targets)]
        if values and all(isinstance(v, ast.Call) and info.callee_last(v) == "device_count"
                          for v in values):
            return f"`{n.id}` = torch.cuda.device_count()"
    return ""


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
                yield arm, "DDP040", (
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
    infos = _project(info)
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


def _project(info: ModuleInfo) -> list[ModuleInfo]:
    """`info` first, then the other files on the command line."""
    others: list[ModuleInfo] = getattr(info.file_set, "infos", [])
    return [info, *(i for i in others if i is not info)]


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
    infos = _project(info)
    for other in infos:
        for rec in other.calls_named("add_argument"):
            flags = {str(a.value).lstrip("-").replace("-", "_") for a in rec.node.args
                     if isinstance(a, ast.Constant)}
            dest = kwarg(rec.node, "dest")
            if isinstance(dest, ast.Constant):
                flags = {str(dest.value)}
            default = kwarg(rec.node, "default")
            if attr in flags:
                if isinstance(default, ast.Constant) and default.value == 1:
                    where = f"{other.path.rsplit('/', 1)[-1]}:{rec.node.lineno}"
                    return f"the option's default, 1 ({where})"
                return ""
    return ""


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.multiprocessing as mp

def train(rank):
    dist.init_process_group("nccl", init_method="tcp://localhost:34567",
                            world_size=8, rank=rank)

def main():
    mp.spawn(train, nprocs=torch.cuda.device_count())
"""

RULE = ddp040
