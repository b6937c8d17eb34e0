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
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import Func, ModuleInfo, kwarg
from ..analysis.provenance import dotted
from ..registry import Hit, rule


@rule('DDP040', 'world-size-mismatch', 'error',
      'the group is formed with a world size that is not the number of processes started',
      'pass the count of processes you start as the world size')
def ddp040(info: ModuleInfo) -> Iterator[Hit]:
    yield from _spawned_literal(info)


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
