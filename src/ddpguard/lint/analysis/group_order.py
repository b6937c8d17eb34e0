"""A rank test that runs before the process group exists.

    def main(args):
        if utils.is_main_process():        # get_rank() is 0 while no group exists
            output_root = make_run_folder()
        utils.init_distributed_mode(args)  # the group is formed only here
        print(output_root)

A project's predicate that asks the group (`get_rank() == 0`, with `get_rank` returning 0 when
`dist.is_initialized()` is false: the DETR/torchvision references' `utils.py`) is true on
every process before the group is formed, so such a test splits no ranks there (corpus35q's
segmentation_benchmark, false at first contact). A predicate that reads the launcher's
environment (`RANK`) splits them at any time and is not this.
"""

from __future__ import annotations

import ast

from .callgraph import calls_by_func, resolve
from .context import CallRec, Func, ModuleInfo

_ASKS = {"get_rank", "is_initialized", "get_global_rank"}


def before_group(info: ModuleInfo, func: Func | None, test: ast.If) -> bool:
    """`test` calls a project predicate that asks the group for the rank, and `func` forms
    the group (calls `init_process_group`, or a project function that does) only after it."""
    if func is None:
        return False
    inside = {id(n) for n in ast.walk(test.test)}
    recs = calls_by_func(info).get(id(func), [])
    asks = [r for r in recs if id(r.node) in inside]
    if not asks or not all(_asks_group(info, r, 0) for r in asks):
        return False
    forms = [r.node.lineno for r in recs if _forms_group(info, r, 0)]
    return bool(forms) and min(forms) > (test.end_lineno or test.lineno)


def _asks_group(info: ModuleInfo, rec: CallRec, depth: int) -> bool:
    """The call is answered by the group (dist.get_rank()), through project functions that
    read no environment variable."""
    if rec.last in _ASKS and (info.qualify(rec.node.func) or "").startswith("torch.distributed"):
        return True
    target = resolve(info, rec) if depth < 3 else None
    if target is None:
        return False
    m, fn = target
    if any(isinstance(n, ast.Attribute) and n.attr == "environ" or
           isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "getenv"
           for n in ast.walk(fn)):
        return False
    return any(_asks_group(m, r, depth + 1) for r in calls_by_func(m).get(id(fn), []))


def _forms_group(info: ModuleInfo, rec: CallRec, depth: int) -> bool:
    if rec.last == "init_process_group":
        return True
    target = resolve(info, rec) if depth < 2 else None
    if target is None:
        return False
    m, fn = target
    return any(_forms_group(m, r, depth + 1) for r in calls_by_func(m).get(id(fn), []))
