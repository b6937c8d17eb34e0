"""DDP048 an attribute of the wrapped model read on the DDP wrapper.

`DistributedDataParallel(model)` is a module of its own: it has nn.Module's methods
(`parameters()`, `state_dict()`, `train()`, ...) and DDP's (`module`, `no_sync()`, ...), and
nn.Module's `__getattr__` finds only its own parameters, buffers and its one sub-module,
`module`. The wrapped model's methods and attributes (`generate()`, `encode()`, a `config`, a
sub-module `backbone`) are not there: `model.generate(...)` on the wrapper raises
AttributeError. Where a rank test lets only rank 0 through (a sample or an evaluation at the
end of an epoch), rank 0 dies there while the other ranks wait for it in their next collective.

Reported: a call through an attribute torch's wrapper lacks (not starting with `_`):
`model.generate(...)`, `model.config.save(...)`, `model.backbone.parameters()`, on a name that
holds the wrapper at that point: the function bound it to `DistributedDataParallel(...)` on an
earlier line and never rebinds it after; `self.x`, which every assignment in the class binds
to the wrap (read in the method that wraps, after the wrap, or in another method of the
class); a parameter that every call in the files passes a wrapper. Left alone: a read under
`try`, in the arm of the `if` that did not wrap, in a function that asks `hasattr`,
`getattr` or `isinstance` of the name, an attribute the program sets on the wrapper itself,
and wrappers other than torch's (a project subclass may forward attributes). Reads that no
call goes through (`print(model.config)`) are not followed. Fix: call it on
the wrapped model, `model.module.generate(...)`, or keep a reference to the bare model.

A preview rule since the twenty-second round: six of its seven first findings on unseen code
were false (a helper's parameter read as the wrapper where the caller had rebound its name to
`model.module` before the call; that shape is silent since).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import ModuleInfo
from ..analysis.provenance import NONE
from ..analysis.wrapper_attrs import missing_attributes
from ..registry import Hit, rule


@rule('DDP048', 'wrapper-attribute', 'error',
      "an attribute of the wrapped model read on the DDP wrapper, which lacks it",
      'use the wrapped model: `model.module.<name>`', preview=True)
def ddp048(info: ModuleInfo) -> Iterator[Hit]:
    if not info.wraps_ddp and not info.handed_params:
        return
    for acc in missing_attributes(info):
        node = acc.node
        what = "call" if any(isinstance(n, ast.Call) and n.func is node
                             for n in acc.chain[-1:]) else "read"
        some = any(isinstance(n, ast.If) and info.rank_level(n.test) != NONE
                   for n in acc.chain) or (
            acc.func is not None and info.guarded_funcs.get(acc.func, NONE) != NONE)
        tail = ("only the ranks a rank test lets through get here: they die while the others "
                "go on, and wait for them in the next collective"
                if some else "every rank that gets here dies")
        where = (f"wrapped at line {acc.wrapped_at}" if acc.func is None
                 or acc.wrapped_at != acc.func.lineno
                 else f"every call hands `{acc.func.name}` a wrapper")
        yield node, "DDP048", (
            f"`{acc.holder}` is the DDP wrapper here ({where}), which has no attribute "
            f"`{node.attr}`: DDP has nn.Module's methods and its own (`module`, `no_sync`), not "
            f"the wrapped model's, so this {what} raises AttributeError; {tail}; use "
            f"`{acc.holder}.module.{node.attr}`")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main(net, loader, optimizer):
    dist.init_process_group("nccl")
    model = DistributedDataParallel(net.cuda())
    for batch in loader:
        model(batch).sum().backward()
        optimizer.step()
    if dist.get_rank() == 0:
        print(model.generate(max_new_tokens=50))
"""

RULE = ddp048
