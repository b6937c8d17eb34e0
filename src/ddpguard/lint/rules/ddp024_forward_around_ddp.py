"""DDP024 a training forward around the DDP wrapper.

`loss = model.module.train_step(batch)` (or `model.module(x)`,
`self.netG.module.forward_flow(...)`) where `model` holds a DDP wrapper, and the loss that is
backpropagated comes from that call: DDP arms its gradient all-reduce in its own forward, so
this backward all-reduces nothing and every rank trains its own copy of the model, silently (no
hang, no error; the replicas drift apart and only rank 0's is saved). Seen in P5's pretraining
and ProPainter's flow-completion trainer. Reported only where the flow is visible in the
function (assignments from the call to the receiver of `.backward()`, not through `.detach()`,
`.data` or `.item()`), in a loop (or a function without one) that also steps an optimizer and
never calls the wrapper itself or its `forward`, not under `no_grad`, in a module that does not
all-reduce gradients by hand; a plain local name is the wrapper only in the function that
wrapped it, an attribute of `self` in every method. Methods that read or move the module
(`parameters`, `state_dict`, `train`, `to`, ...) are no forward. The same through a name that
holds the bare model (`model_without_ddp = model.module` in the arm that wraps, then
`model_without_ddp.query_forward(...)` in the step). Fix: call the wrapper
(`model(batch)`); make the training method the module's `forward`, or wrap a small module whose
forward calls it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.callgraph import GRAPH_CUTS, graph_reads, syncs_grads_by_hand
from ..analysis.context import CallRec, Func, ModuleInfo, dotted, is_optimizer_step
from ..registry import Hit, rule

# nn.Module methods that run no forward: reading or moving the module, not computing with it.
_NOT_FORWARD = {"parameters", "named_parameters", "state_dict", "load_state_dict", "train",
                "eval", "to", "cuda", "cpu", "zero_grad", "modules", "named_modules",
                "children", "named_children", "buffers", "named_buffers", "apply",
                "requires_grad_", "half", "float", "double", "bfloat16", "register_buffer",
                "register_forward_hook", "register_forward_pre_hook", "get_submodule",
                "get_parameter", "add_module", "type", "share_memory", "extra_repr"}


_NO_GRAD = ("no_grad", "inference_mode")


@rule("DDP024", "forward-around-ddp", "error",
      "the training forward calls the DDP wrapper's `.module` (the bare model), so the "
      "backward that follows never all-reduces the gradients",
      "call the wrapper itself (`model(batch)`); make the training method the module's "
      "forward, or wrap a small module whose forward calls it")
def ddp024(info: ModuleInfo) -> Iterator[Hit]:
    """DDP arms its gradient all-reduce in its own forward (`prepare_for_backward`); a loss
    computed through `model.module.train_step(batch)` skips that, so backward leaves every
    rank's gradients its own and the replicas drift apart in silence (P5's pretraining,
    ProPainter's flow-completion trainer). Reported only where the loss
    that is backpropagated visibly comes from that call, in a loop or function that never
    calls a DDP wrapper's own forward (this one's, or another's the loss may pass through,
    `model_net(agent.module.embed(x))`) and never all-reduces gradients by hand."""
    wrapped = info.ddp_names() if info.wraps_ddp else {}
    if not wrapped:
        return
    by_hand: bool | None = None
    # Names that hold a wrapper's `.module` (`model_without_ddp = model.module`), once.
    bare: set[str] = set()
    attribute = ast.Attribute
    for d, entries in info.assigns.items():
        for _, v in entries:
            if type(v) is attribute and v.attr == "module" and dotted(v.value) in wrapped:
                bare.add(d)
                break
    for rec in info.calls:
        if rec.last in _NOT_FORWARD:
            continue
        f = rec.node.func
        if type(f) is ast.Attribute:
            owner = _module_of_wrapper(f, wrapped, info, rec) or (
                _bare_alias(f.value, wrapped, info, rec) if dotted(f.value) in bare else None)
        elif type(f) is ast.Name and f.id in bare:
            owner = _bare_alias(f, wrapped, info, rec)
        else:
            continue
        if owner is None:
            continue
        if by_hand is None:
            by_hand = syncs_grads_by_hand(info)
        if by_hand:
            return
        scope = _iteration(info, rec)
        # any wrapper's own forward in the step arms that wrapper's all-reduce: MaxReward's
        # `model_net(agent.module.text2emb(s))`, where `model_net` is what the optimizer trains
        if any(_wrapper_forward(dotted(r.node.func), wrapped) for r in scope) \
                or not any(is_optimizer_step(r.node) for r in scope) \
                or _under_no_grad(rec):
            continue
        if _feeds_backward(rec.node, scope, rec.func if rec.func is not None else info.tree):
            yield rec.node, "DDP024", (
                f"the loss comes from `{dotted(rec.node.func)}()`, the model inside the DDP "
                f"wrapper `{owner}`: DDP's forward never runs, so this step's backward "
                "all-reduces no gradient and every rank trains its own copy")


def _wrapper_forward(name: str | None, wrapped: dict[str, int]) -> bool:
    return name is not None and (name in wrapped or name.endswith(".forward")
                                 and name[:-len(".forward")] in wrapped)


def _module_of_wrapper(func: ast.expr, wrapped: dict[str, int], info: ModuleInfo,
                       rec: CallRec) -> str | None:
    """`W.module(...)` or `W.module.f(...)` for a name W that holds a DDP wrapper here: an
    attribute of `self`, or a plain name wrapped in the same function."""
    node = func
    while isinstance(node, ast.Attribute):
        if node.attr == "module":
            owner = dotted(node.value)
            if owner in wrapped and (owner.startswith("self.") or any(
                    w.func is rec.func or _closure_of(info, w.func, rec.func, owner)
                    for w in info.ddp_wraps(owner))):
                return owner
            return None
        node = node.value
    return None


def _closure_of(info: ModuleInfo, outer: Func | None, inner: Func | None, name: str) -> bool:
    """`inner` is a function defined inside `outer` (None: the module) that reads `outer`'s
    `name` (PepHAR's `def train(it):` under `if __name__ == "__main__":`, using the `model`
    wrapped there): it binds no `name` of its own (a parameter or an assignment)."""
    if inner is None or inner is outer:
        return False
    if outer is not None and not (outer.lineno < inner.lineno and
                                  (inner.end_lineno or 0) <= (outer.end_lineno or 0)):
        return False
    params = {a.arg for a in [*inner.args.posonlyargs, *inner.args.args,
                              *inner.args.kwonlyargs]}
    return name not in params and not any(
        inner.lineno <= line <= (inner.end_lineno or inner.lineno)
        for line, _ in info.assigns.get(name, []))


def _bare_alias(node: ast.expr, wrapped: dict[str, int], info: ModuleInfo,
                rec: CallRec) -> str | None:
    """The wrapper W whose `.module` the name `node` holds (`model_without_ddp = model.module`
    in the arm that wraps, CIRtoolbox's `model_without_ddp.query_forward(...)`), assigned in
    the function of the call (an attribute of `self`: in any method)."""
    d = dotted(node)
    if d is None:
        return None
    fn = rec.func
    for line, v in info.assigns.get(d, []):
        if not (isinstance(v, ast.Attribute) and v.attr == "module"):
            continue
        owner = dotted(v.value)
        here = d.startswith("self.") or fn is not None and \
            fn.lineno <= line <= (fn.end_lineno or fn.lineno)
        if owner in wrapped and here:
            return owner
    return None


def _iteration(info: ModuleInfo, rec: CallRec) -> list[CallRec]:
    """The calls of one training step: the innermost loop around `rec`, or its function."""
    if rec.loops:
        loop = rec.loops[-1]
        return [r for r in info.calls if loop in r.loops]
    return [r for r in info.calls if r.func is rec.func and not r.loops]


def _under_no_grad(rec: CallRec) -> bool:
    """Inside `with torch.no_grad():` (or `inference_mode`), or in a function decorated so."""
    scope = rec.func
    if scope is None:
        return False
    if any((dotted(d.func if isinstance(d, ast.Call) else d) or "").endswith(_NO_GRAD)
           for d in scope.decorator_list):
        return True
    for w in ast.walk(scope):
        if isinstance(w, ast.With) and any(
                isinstance(i.context_expr, ast.Call)
                and (dotted(i.context_expr.func) or "").endswith(_NO_GRAD) for i in w.items) \
                and any(n is rec.node for n in ast.walk(w)):
            return True
    return False


def _targets(t: ast.expr) -> set[str]:
    if isinstance(t, ast.Tuple | ast.List):
        return {d for e in t.elts for d in _targets(e)}
    if isinstance(t, ast.Starred):
        return _targets(t.value)
    d = dotted(t.value if isinstance(t, ast.Subscript) else t)
    return {d} if d is not None else set()


def _feeds_backward(call: ast.Call, scope: list[CallRec], body: ast.AST) -> bool:
    """A `.backward()` of this step reads, through assignments in the same function (`body`),
    a value computed from `call` (without a `.detach()` on the way)."""
    assigns = [(st.targets if isinstance(st, ast.Assign) else [st.target], st.value)
               for st in ast.walk(body) if isinstance(st, ast.Assign | ast.AugAssign
                                                      | ast.AnnAssign) and st.value is not None]
    tainted: set[str] = set()
    for targets, value in assigns:
        if _call_used(value, call):
            tainted |= {d for t in targets for d in _targets(t)}
    for _ in range(len(assigns)):
        grew = False
        for targets, value in assigns:
            if graph_reads(value) & tainted:
                new = {d for t in targets for d in _targets(t)} - tainted
                if new:
                    tainted |= new
                    grew = True
        if not grew:
            break
    for r in scope:
        if r.last == "backward" and isinstance(r.node.func, ast.Attribute):
            receiver = r.node.func.value
            if _call_used(receiver, call) or graph_reads(receiver) & tainted:
                return True
    return False


def _call_used(value: ast.expr, call: ast.Call) -> bool:
    """`call` is read by `value` other than through a graph cut (`f(x).detach()`)."""
    todo: list[ast.AST] = [value]
    while todo:
        n = todo.pop()
        if n is call:
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr in GRAPH_CUTS:
            continue
        todo.extend(ast.iter_child_nodes(n))
    return False


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Runner:
    def __init__(self, model, optim, args):
        self.model = DDP(model, device_ids=[args.gpu])
        self.optim = optim
        self.args = args

    def train(self, loader):
        for step_i, batch in enumerate(loader):
            if self.args.distributed:
                results = self.model.module.train_step(batch)
            else:
                results = self.model.train_step(batch)
            loss = results["loss"]
            loss.backward()
            self.optim.step()
            self.optim.zero_grad()
"""

RULE = ddp024
