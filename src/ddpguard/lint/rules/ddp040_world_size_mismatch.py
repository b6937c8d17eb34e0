"""DDP040 the group is formed with a world size that is not the number of processes started.

`init_process_group` waits until `world_size` processes have joined.

```python
def train(rank):
    dist.init_process_group("nccl", init_method="tcp://localhost:34567",
                            world_size=8, rank=rank)
    ...

if __name__ == "__main__":
    mp.spawn(train, nprocs=torch.cuda.device_count())
```

The function `mp.spawn` starts (or one it calls) forms the group with `world_size=<literal>`,
while the spawn's `nprocs` is another literal or the machine's GPU count
(`torch.cuda.device_count()`, directly or through a name). With fewer processes than the
literal, every process waits in the rendezvous for ranks that never start, until the timeout;
with more, the ranks past it fail. Fix: pass the count you spawn (`world_size=nprocs`) to
every process. (A SLURM arm that sets the rank and not the world size is DDP042, in preview.)

Also reported: the function the spawn starts passes its spawn index as the rank and takes
the world size from a command-line option with a literal default (`args.world_size`,
`add_argument("--world_size", type=int, default=2)`) that nothing in the files sets from
the count spawned, while `nprocs` is the GPU count or another literal: the run works only
when the option is given equal to that count. Left alone: a rank with a node offset
(`node_rank * ngpus + gpu`, several nodes, where the two counts differ by design), an option
the program assigns (`args.world_size = ngpus * args.world_size`), a config file that
updates the options, a world size passed in by the spawn's `args`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.bindings import stores
from ..analysis.context import CallRec, Func, ModuleInfo, kwarg
from ..analysis.options import parsed_only
from ..analysis.provenance import dotted
from ..registry import Hit, rule


@rule('DDP040', 'world-size-mismatch', 'error',
      'the group is formed with a world size that is not the number of processes started',
      'pass the count of processes you start as the world size')
def ddp040(info: ModuleInfo) -> Iterator[Hit]:
    yield from _spawned_literal(info)
    yield from _spawned_option(info)


def _spawned_literal(info: ModuleInfo) -> Iterator[Hit]:
    for rec in info.calls_named("init_process_group"):
        ws = kwarg(rec.node, "world_size")
        if rec.func is None or not (isinstance(ws, ast.Constant) and type(ws.value) is int
                                    and ws.value > 1):
            continue
        found = _other_count(info, info.calls_named("spawn", "start_processes"), rec.func,
                             str(ws.value))
        if found:
            spawn, count = found
            yield ws, "DDP040", (
                f"init_process_group(world_size={ws.value}) at line {rec.node.lineno}, but "
                f"the spawn at line {spawn.node.lineno} starts {count} processes: with "
                f"fewer than {ws.value}, every process waits in the rendezvous for ranks "
                f"that never start, until the timeout; with more, the ranks past "
                f"{ws.value - 1} fail; pass the count you spawn as the world size")


def _spawned_option(info: ModuleInfo) -> Iterator[Hit]:
    spawns = info.calls_named("spawn", "start_processes")
    for rec in info.calls_named("init_process_group") if spawns else ():
        ws = kwarg(rec.node, "world_size")
        if rec.func is None or ws is None or not _spawn_index(rec.func, kwarg(rec.node, "rank")):
            continue
        attr = _option_attr(rec.func, ws)
        opt = parsed_only(info, attr) if attr else None
        if opt is None or type(opt.default) is not int:
            continue
        found = _other_count(info, spawns, rec.func, str(opt.default), directly=True)
        if found:
            spawn, count = found
            yield ws, "DDP040", (
                f"init_process_group(world_size=...) at line {rec.node.lineno} takes the "
                f"group's size from the option --{opt.name} (default {opt.default}, "
                f"{opt.where}), while the spawn at line {spawn.node.lineno} starts {count} "
                f"processes, each passing its spawn index as the rank: the run works only "
                f"when the option is given equal to that count; with more processes, the "
                f"ranks past {opt.default - 1} fail; with fewer, every process waits in the "
                f"rendezvous for ranks that never start, until the timeout; pass the count "
                f"you spawn as the world size")


def _other_count(info: ModuleInfo, spawns: list[CallRec], target: Func, expected: str,
                 directly: bool = False) -> tuple[CallRec, str] | None:
    """The first spawn of `target` that starts a known count of processes other than
    `expected`, with that count as the message names it."""
    for spawn in spawns:
        if _starts(info, spawn.node, target, directly):
            count = _nprocs(info, spawn.node, spawn.func)
            if count and count != expected:
                return spawn, count
    return None


def _spawn_index(func: Func, rank: ast.expr | None) -> bool:
    """`rank=<the started function's first parameter>`, never rebound: the spawn index, 0 to
    nprocs - 1, with no node offset."""
    params = func.args.posonlyargs + func.args.args
    if not (isinstance(rank, ast.Name) and params and params[0].arg == rank.id):
        return False
    return stores(func, rank.id) == 0


def _option_attr(func: Func, ws: ast.expr) -> str:
    """`world_size` for `world_size=args.world_size`, or for a name the function binds only
    to it; "" otherwise."""
    if isinstance(ws, ast.Attribute) and isinstance(ws.value, ast.Name):
        return ws.attr
    if not isinstance(ws, ast.Name) or any(a.arg == ws.id for a in func.args.args):
        return ""
    values = [st.value for st in ast.walk(func) if isinstance(st, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == ws.id for t in st.targets)]
    if len(values) != 1 or stores(func, ws.id) != 1:
        return ""
    v = values[0]
    return v.attr if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) else ""


def _starts(info: ModuleInfo, call: ast.Call, target: Func, directly: bool = False) -> bool:
    """`mp.spawn(target, ...)`, or (unless `directly`) a spawn of a function of this file that
    calls `target`."""
    if not call.args or not (info.qualify(call.func) or "").endswith(
            ("multiprocessing.spawn", "multiprocessing.start_processes", "mp.spawn")):
        return False
    name = dotted(call.args[0])
    started = name.rsplit(".", 1)[-1] if name else ""
    if started == target.name:
        return True
    if directly:
        return False
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
