"""DDP035 a home-made launcher that never ends the other ranks when one fails.

```python
procs = []
for rank in range(args.num_gpus):
    cmd = [sys.executable, "train.py", f"--rank={rank}", f"--world_size={args.num_gpus}"]
    procs.append(subprocess.Popen(cmd))
for p in procs:
    p.wait()                     # rank 0 first, then rank 1, ...
```

One process per rank, then a wait on each in turn, and nothing that ends the others: when one
rank dies (an out-of-memory error, a bad sample, a full disk), its peers wait in their next
collective for it, until the group's timeout or forever where none ends them, and the launcher
waits on them. torchrun, `torch.multiprocessing.spawn` and `start_processes` watch every
process and end the rest at the first failure. Reported for `subprocess.Popen(...)` started in
a loop whose command or environment carries the loop's index as the rank, and for
`multiprocessing.Process(target=f, args=(rank, ...))` started in a loop
(`torch.multiprocessing` and a context's `Process` too; `f` bound with `functools.partial`
first, and forming the group itself or in a function it calls, in this file or another given
one), when the processes are then waited on one by one (`.wait()`, `.communicate()`, `.join()`)
and the module never terminates or kills a process, polls one, reads an exit code, or waits on
their sentinels. Fix: launch with `torchrun` (or `torch.multiprocessing.spawn`), or poll all
processes and terminate the rest at the first failure.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.callgraph import calls_by_func, resolve
from ..analysis.context import Func, ModuleInfo, dotted
from ..registry import Hit, rule

_ENDS = {"terminate", "kill", "killpg", "poll", "sentinel", "exitcode", "send_signal",
         "join_all", "wait_for"}
_WAITS = {"wait", "communicate", "join"}


@rule('DDP035', 'launcher-without-teardown', 'error',
      'one process per rank started by hand, then waited on one by one: nothing ends the '
      'others when one fails',
      'launch with torchrun or torch.multiprocessing.spawn, or poll every process and '
      'terminate the rest at the first failure')
def ddp035(info: ModuleInfo) -> Iterator[Hit]:
    starts = info.calls_named("Popen", "Process")
    if not starts or _ends_processes(info):
        return
    told: set[int] = set()
    for rec in starts:
        kind = _per_rank_start(info, rec.node, rec.loops[-1] if rec.loops else None)
        if kind is None:
            continue
        loop = rec.loops[-1]
        assert isinstance(loop, ast.For)  # _per_rank_start took only a `for` loop
        held = _held_in(loop, rec.node)
        if held is None:
            continue
        wait = _waited_in_turn(rec.func.body if rec.func is not None else info.tree.body,
                               held, loop)
        if wait is None or id(wait) in told:
            continue
        told.add(id(wait))
        yield wait, "DDP035", (
            f"{kind} at line {rec.node.lineno} starts one process per rank, and the loop at "
            f"line {wait.lineno} waits on them one by one while nothing ends the others when "
            "one fails: a rank that dies leaves its peers waiting in their next collective "
            "(until the group's timeout, or forever where none ends them) and this launcher "
            "waiting on them; launch with torchrun or torch.multiprocessing.spawn, which end "
            "the rest at the first failure, or poll every process and terminate the others")


def _ends_processes(info: ModuleInfo) -> bool:
    """The module ends, polls or watches its processes somewhere (its own teardown)."""
    for n in ast.walk(info.tree):
        if isinstance(n, ast.Attribute) and n.attr in _ENDS:
            return True
        if isinstance(n, ast.Name) and n.id in ("kill", "killpg"):
            return True
    return False


def _per_rank_start(info: ModuleInfo, call: ast.Call, loop: ast.AST | None) -> str | None:
    """`subprocess.Popen(cmd)` whose command or environment carries the loop's index, or
    `Process(target=f, args=(rank, ...))` with the index among its arguments: what starts
    it, or None."""
    if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name):
        return None
    index = loop.target.id
    q = info.qualify(call.func) or dotted(call.func) or ""
    if q.endswith("Popen") and (q.startswith("subprocess") or q == "Popen"):
        uses = [n for st in loop.body for n in ast.walk(st)
                if isinstance(n, ast.Name) and n.id == index and isinstance(n.ctx, ast.Load)]
        words = {str(n.value).lower() for st in loop.body for n in ast.walk(st)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str)} | {
            str(n.arg).lower() for st in loop.body for n in ast.walk(st)
            if isinstance(n, ast.keyword)}
        if uses and any("rank" in w for w in words) or uses and "rank" in index.lower():
            return "subprocess.Popen()"
        return None
    if q.endswith("Process") and ("multiprocessing" in q or q.split(".")[0] in (
            "mp", "ctx", "Process") or "ctx" in q):
        args = next((k.value for k in call.keywords if k.arg == "args"), None)
        target = next((k.value for k in call.keywords if k.arg == "target"), None)
        if target is None or args is None:
            return None
        if any(isinstance(n, ast.Name) and n.id == index for n in ast.walk(args)) and \
                _forms_group(info, target):
            return f"Process(target={ast.unparse(target)})"
    return None


def _forms_group(info: ModuleInfo, target: ast.expr) -> bool:
    """The process's function forms a process group, in it or in a function it calls a few
    calls deep, in this file or another given one (diffwave's `init_distributed()` in
    distributed_util.py); the target may be a `partial(f, ...)` bound to a name first."""
    name = _target_name(info, target)
    todo: list[tuple[ModuleInfo, Func]] = [(info, fn) for fn in info.funcs.get(name, [])]
    seen: set[int] = set()
    while todo:
        m, fn = todo.pop()
        if id(fn) in seen or len(seen) > 12:
            continue
        seen.add(id(fn))
        for rec in calls_by_func(m).get(id(fn), []):
            if rec.last == "init_process_group":
                return True
            local = m.local_callees(rec)
            todo.extend((m, f) for f in local)
            if not local and (site := resolve(m, rec)) is not None:
                todo.append(site)
    return False


def _target_name(info: ModuleInfo, target: ast.expr) -> str:
    """`f` for `target=f`, and for `target=train_fn` where `train_fn = partial(f, ...)`."""
    if isinstance(target, ast.Call) and info.callee_last(target) == "partial" and target.args:
        target = target.args[0]
    if not isinstance(target, ast.Name):
        return ""
    if target.id not in info.funcs:
        values = [v for _, v in info.assigns.get(target.id, [])]
        if len(values) == 1 and isinstance(values[0], ast.Call) \
                and info.callee_last(values[0]) == "partial" and values[0].args \
                and isinstance(values[0].args[0], ast.Name):
            return values[0].args[0].id
    return target.id


def _held_in(loop: ast.AST, call: ast.Call) -> str | None:
    """The list the loop appends the started process to (`procs.append(p)`, or
    `procs.append(Popen(...))`)."""
    bound = {t.id for st in ast.walk(loop) if isinstance(st, ast.Assign) and st.value is call
             for t in st.targets if isinstance(t, ast.Name)}
    for n in ast.walk(loop):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr == "append" and n.args \
                and (n.args[0] is call or isinstance(n.args[0], ast.Name)
                     and n.args[0].id in bound):
            return dotted(n.func.value)
    return None


def _waited_in_turn(body: list[ast.stmt], held: str, start: ast.For) -> ast.For | None:
    """A later `for p in <held>: p.wait()` (or `.join()`, `.communicate()`)."""
    for n in (x for st in body for x in ast.walk(st)):
        if not isinstance(n, ast.For) or n is start or n.lineno <= start.lineno \
                or dotted(n.iter) != held or not isinstance(n.target, ast.Name):
            continue
        var = n.target.id
        if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
               and c.func.attr in _WAITS and dotted(c.func.value) == var
               for st in n.body for c in ast.walk(st)):
            return n
    return None


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import subprocess
import sys

procs = []
for rank in range(4):
    cmd = [sys.executable, "train.py", f"--rank={rank}", "--world_size=4"]
    procs.append(subprocess.Popen(cmd))
for p in procs:
    p.wait()
"""

RULE = ddp035
