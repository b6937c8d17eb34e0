"""DDP033 a script that torchrun launches spawns a world of its own.

```python
if args.nodes > 1:                      # "multi-node: launched with torchrun"
    rank = int(os.environ["RANK"])
    train(rank, int(os.environ["WORLD_SIZE"]))
else:
    mp.spawn(train, args=(world_size,), nprocs=torch.cuda.device_count())
```

The script reads the launcher's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`) in an arm of an
`if` that does not hold its `mp.spawn`, so it has a path for torchrun (or
torch.distributed.launch) beside the spawning one; but the spawn sits on a path chosen by the
script's own options, not by whether a launcher started it. Started by torchrun with those
options (one node, the default), every process torchrun started spawns a whole world of its
own: several sets of ranks 0..n-1 meet at one address and port (the children inherit torchrun's
environment), the rendezvous takes the wrong members or waits, and the node's GPUs are shared
by n times too many processes. Not where a test of the environment or of the launcher (`"RANK"
in os.environ`, `args.local_rank == -1`, `args.launcher == "pytorch"`, an option naming the
spawn, `args.multiprocessing_distributed`) keeps the spawn off the launcher's path, nor where
the variable is read on every path (`args.nr = int(os.environ["RANK"])` before spawning: a
node's rank from a launcher that starts one process per node).

In preview: the file does not say that torchrun starts it on the spawning path; the finding
assumes it (a launch script or README usually does). Fix: under a launcher, take its `RANK`
and `WORLD_SIZE` and do not spawn (`if "RANK" in os.environ: ... else: mp.spawn(...)`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import ModuleInfo
from ..analysis.enclosing import enclosing
from ..analysis.provenance import dotted, name_level
from ..registry import Hit, rule

_LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK"}
# Options that pick how the processes start (`args.launcher`, ImageNet's
# `--multiprocessing-distributed`, `args.multi_spawn`): the user chose to spawn.
_LAUNCH_WORDS = ("launch", "dist_url", "torchrun", "elastic", "spawn", "multiprocessing")


@rule('DDP033', 'spawn-under-launcher', 'warning',
      'a script that reads torchrun\'s variables spawns its own processes on a path '
      'torchrun also takes',
      'under a launcher use its RANK and WORLD_SIZE; spawn only where no launcher started it',
      preview=True)
def ddp033(info: ModuleInfo) -> Iterator[Hit]:
    if not (info.spelled & _LAUNCHER_VARS and info.calls_named("spawn", "start_processes")):
        return
    reads = [n for n in ast.walk(info.tree) if isinstance(n, ast.Constant)
             and n.value in _LAUNCHER_VARS and _environ_read(info.tree, n)]
    if not reads:
        return
    for rec in info.calls_named("spawn", "start_processes"):
        if not (info.qualify(rec.node.func) or "").startswith("torch.multiprocessing"):
            continue
        chain = enclosing(rec.func, info.tree, rec.stmt or rec.node)
        if chain is None or any(_picks_launcher(t) for t in _tests(chain)) \
                or rec.func is not None and _picks_launcher_above(info, rec.func.name):
            continue
        scope: ast.AST = rec.func if rec.func is not None else info.tree
        reads = _on_another_path(scope, reads, rec.node)
        if not reads:
            continue
        yield rec.node, "DDP033", (
            f"mp.spawn() here sits on a path the script's own options pick, while the script "
            f"reads the launcher's {reads[0].value!s} on a path of its own (line "
            f"{reads[0].lineno}): assuming "
            "torchrun also starts it this way (one node, the default options), every process "
            "torchrun started spawns a world of its own, several ranks 0..n-1 meet at one "
            "address and the rendezvous takes the wrong members or waits; under a launcher, "
            "use its RANK and do not spawn")
        return


def _on_another_path(scope: ast.AST, reads: list[ast.Constant],
                     spawn: ast.Call) -> list[ast.Constant]:
    """The reads that sit in an arm of an `if` of the spawn's own function that does not hold the
    spawn: the script has a launcher's path beside the spawning one. A read on every path
    (`args.nr = int(os.environ["RANK"])` before spawning, a node's rank from a one-process-
    per-node launcher) is not that."""
    out: list[ast.Constant] = []
    for n in ast.walk(scope):
        if isinstance(n, ast.If):
            for arm in (n.body, n.orelse):
                held = {id(x) for st in arm for x in ast.walk(st)}
                if id(spawn) not in held:
                    out += [r for r in reads if id(r) in held and r not in out]
    return sorted(out, key=lambda r: r.lineno)


def _environ_read(tree: ast.Module, const: ast.Constant) -> bool:
    """`const` is a key read from the environment: `os.environ["RANK"]`,
    `os.environ.get("RANK")`, `os.getenv("RANK")`, `"RANK" in os.environ`."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and n.slice is const:
            return isinstance(n.ctx, ast.Load) and dotted(n.value) in ("os.environ", "environ")
        if isinstance(n, ast.Call) and n.args and n.args[0] is const:
            return (dotted(n.func) or "") in ("os.environ.get", "environ.get", "os.getenv")
        if isinstance(n, ast.Compare) and n.left is const:
            return any(dotted(c) in ("os.environ", "environ") for c in n.comparators)
    return False


def _tests(chain: list[ast.AST]) -> list[ast.expr]:
    return [n.test for n in chain if isinstance(n, ast.If | ast.While | ast.IfExp)]


def _picks_launcher(test: ast.AST) -> bool:
    """A test of the environment, of a rank (`args.local_rank == -1`), or of a launcher
    option (`args.launcher`, `args.dist_url`)."""
    for n in ast.walk(test):
        d = dotted(n) or ""
        if "environ" in d or "getenv" in d or name_level(d) or \
                any(w in d.lower() for w in _LAUNCH_WORDS):
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isupper():
            return True
    return False


def _picks_launcher_above(info: ModuleInfo, name: str) -> bool:
    """The function holding the spawn is called only under such a test (one level up)."""
    sites = [rec for rec in info.calls if rec.callee == name or rec.last == name]
    for rec in sites:
        chain = enclosing(rec.func, info.tree, rec.stmt or rec.node)
        if chain is not None and any(_picks_launcher(t) for t in _tests(chain)):
            return True
    return False


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.multiprocessing as mp

if args.nodes > 1:
    train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
else:
    mp.spawn(train, args=(world_size,), nprocs=torch.cuda.device_count())
"""

RULE = ddp033
