"""DDP019 an exit before a collective on some ranks only.

One class can leave in good order (`return`, `sys.exit`, `break`, `continue` in a rank-test arm
of the function itself; a callee's own `return` ends only the callee) where the others go on to
a collective: a rank-0-only `return` when the run directory exists, just before the barrier the
others wait in. No launcher notices a rank that did not fail, so the others wait until the
timeout. A `while` loop's `continue` after which the leaving class's next collective is the one
the others wait in is a retry, not an exit (metaseq's input loop); in a `for` loop over data it
drops that step's collectives and is reported. A `break` that only rank 0 takes leaves the loop
the others go on with: their next iteration's collectives wait too (early stopping decided on
rank 0 alone); so does an exit (`sys.exit()`, `exit()`) at the end of a loop body, and there
the next iteration's DDP forward with gradients counts too (its backward all-reduces). Rank
0's validation through the wrapper under no_grad before such a `break` does not hide it (its
forwards pair with the others' next forward; the `break` still parts them). A
class whose constructor a caller hands the wrapper (`Trainer(model)` after `model = DDP(model)`,
in this file or another; `self.model = model`, or `model.to(device)`, in `__init__`) holds it on
`self` in that class's methods: its early-stop `break` is read against that forward too; so
is a parameter of a project function that every call in the files given fills with the
wrapper (`fit(model, ...)` after `model = DDP(model)`; not a function also handed to
`mp.spawn` or another caller out of sight, nor one a call gives the bare model). A flag that
one class computes is a rank test too: `stop = False` on every rank, `if rank == 0: stop =
stopper.step(loss)`, then `if stop: break` on every rank (a plain name of one function, or a
`self` attribute of one class, bound only by plain assignments; not once it is broadcast or
reassigned outside the arm); the message names the flag and its arm. So is a counter that
one class advances (`self.bad += 1` only under `if self.rank < 1:`, `self.bad = 0` in
`__init__`), where it is compared with a constant: the other ranks hold its first value
(`self.bad >= 7` is false there), and a method that returns that comparison is a rank test
at its callers, in other files too (`stop = trainer.save_models(...)`, `if stop: break`, where
`trainer = Trainer(model, rank)` of the class another file defines: found through the import
that names it, a package's re-export, or, where the files given hold the package's folder but
not its `__init__.py`, the one module of that folder that defines the class). A
rank test `rank < 1` holds on rank 0 alone (and a single process's -1). A rank
test written `not hasattr(args, "local_rank") or args.local_rank == 0` is read as the
comparison alone (every process of a distributed run has its rank), and a rank-guarded exit
call splits a function as a `return` does. An exit in an `except` handler under the rank
test counts (rank 0's `except KeyError: break` when the metric it monitors is missing): the
handler runs on the rank that met the error. Not exits: `raise NotImplementedError` (a stub for
code left out). Not reported
where the exit and the collective sit behind tests of the same non-rank value (`if not fsdp_eval
and not is_rank0: return` ... `if fsdp_eval: broadcast()`): when one class leaves, the other
never reaches that collective. A `raise` is DDP022's. Fix: check the condition on every rank (or
broadcast it) before anyone leaves. Where the others construct the DDP wrapper on the way, the
message names its broadcast as their first wait.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from ..analysis.armed_flags import truth_reads
from ..analysis.context import ModuleInfo, dotted
from ..analysis.divergence import divergences
from ..analysis.enclosing import inside_rank_test
from ..analysis.instances import find_method
from ..analysis.world_size import world_share
from ..registry import At, Hit, rule


@rule("DDP019", "exit-before-collective", "warning",
      "one rank class can leave in good order (return, break, continue, sys.exit) where the "
      "others go on to a collective",
      "check the condition on every rank (or broadcast it) before anyone leaves")
def ddp019(info: ModuleInfo) -> Iterator[Hit]:
    """A `return` that only rank 0 takes, just before a broadcast: when it runs, the other
    ranks wait in the broadcast for a rank that is gone, and no launcher notices (the rank
    did not fail). A `raise` is DDP022's."""
    for d in divergences(info):
        if d.code == "DDP019":
            yield At(d.line), "DDP019", _wrap_first(info, d.line, d.other_site, d.message) + \
                _assumed(info, d.line) + _flag_note(info, d.line)


def _wrap_first(info: ModuleInfo, line: int, site: int, message: str) -> str:
    """Where the others construct the DDP wrapper between the exit and the call that leads to
    the named collective, they wait in its broadcast first (corpus40a's Action-Recognition:
    rank 0's `--show_model` return, then `DistributedDataParallel(model)` on the others):
    the message names that wait before the later one."""
    if not info.wraps_ddp or site <= line:
        return message
    wraps = [r.node.lineno for r in info.calls if line < r.node.lineno < site
             and r.func is not None and r.func.lineno <= line <= (r.func.end_lineno or 0)
             and info.is_ddp_call(r.node) and not (r.guard and inside_rank_test(info, r))]
    if not wraps:
        return message
    return message.replace(" go on to ", f" go on to the DDP constructor's broadcast at line "
                           f"{min(wraps)} first, then ", 1)


def _flag_note(info: ModuleInfo, line: int) -> str:
    """Where the exit's test reads a flag one class computes (`if stop: break` after `if
    rank == 0: stop = ...`), say so: the message's rank test is that assignment's. The same
    where the flag is what another file's method returns from such a value (`stop =
    trainer.save_models(...)`, returning `self.early_stop >= 7`)."""
    for n in ast.walk(info.tree):
        if isinstance(n, ast.If) and n.body and n.body[0].lineno <= line <= (
                n.end_lineno or n.lineno):
            compared = {dotted(c.left) for c in ast.walk(n.test) if isinstance(c, ast.Compare)
                        and dotted(c.left) in info.armed_counters}
            for name in sorted(truth_reads(n.test) | {c for c in compared if c}):
                note = info.armed_flags.get(name) or _method_note(info, name)
                if note:
                    return f" ({note})"
    return ""


def _method_note(info: ModuleInfo, name: str) -> str:
    for _, v in info.assigns.get(name, []):
        rec = info.call_rec(v) if isinstance(v, ast.Call) else None
        hit = find_method(info, rec) if rec is not None else None
        last = hit[1].body[-1] if hit is not None and hit[1].body else None
        if hit is None or not isinstance(last, ast.Return) or last.value is None:
            continue
        notes = [hit[0].armed_flags[d] for d in sorted(hit[0].armed_flags)
                 if any(dotted(x) == d for x in ast.walk(last.value))]
        if notes:
            return (f"`{name}` is what {hit[1].name}() returns at "
                    f"{os.path.basename(hit[0].path)}:{last.lineno}, "
                    f"`{ast.unparse(last.value)}`, where {notes[0]}")
    return ""


def _assumed(info: ModuleInfo, line: int) -> str:
    """What the finding assumed, when the exit's test compares a rank-derived value with a
    share of the world (`rank_c >= size // replication`): rank 0 is below it; which other
    ranks pass is decided at run time."""
    tests = [n.test for n in ast.walk(info.tree) if isinstance(n, ast.If)
             and n.body and n.body[0].lineno <= line <= (n.end_lineno or n.lineno)]
    for test in reversed(tests):
        if any(world_share(info, c.comparators[0]) for c in ast.walk(test)
               if isinstance(c, ast.Compare) and len(c.ops) == 1):
            return (f" (assumed: `{ast.unparse(test)}` holds on some rank when the world "
                    "size does not fit the grid; rank 0 never takes it)")
    return ""


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import os

import torch.distributed as dist


def resume(t, path):
    if dist.get_rank() == 0:
        if not os.path.exists(path):
            return None  # rank 0 leaves ...
    dist.broadcast(t, 0)  # ... the others wait here
"""

RULE = ddp019
