"""Attributes read on a DDP wrapper that the wrapper does not have: `model.generate(...)` where
`model = DistributedDataParallel(net)`. nn.Module's `__getattr__` looks only in the wrapper's
own parameters, buffers and sub-modules (one: `module`), so anything of the wrapped model
(its methods, its sub-modules, a Hugging Face `config`) raises AttributeError there."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import NamedTuple

from .bindings import stores
from .callgraph import calls_by_func
from .context import CallRec, Func, ModuleInfo
from .enclosing import enclosing
from .provenance import dotted

__all__ = ["DDP_ATTRS", "Access", "missing_attributes"]

# The public attributes of torch's wrapper (class and instance, `dir()` of one, torch 2.x;
# tests/lint/test_ddp048_wrapper_attribute.py checks the installed torch adds none), plus a
# few that older releases had. Names with a leading underscore are never reported.
_DDP_NAMES = """
T_destination add_module apply batched_grad_copy bfloat16 broadcast_bucket_size
broadcast_buffers bucket_bytes_cap bucket_bytes_cap_default bucket_bytes_cap_list buffers
call_super_init children compile cpu cuda device device_ids device_type dim double
dump_patches eval extra_repr find_unused_parameters float forward forward_sync_buffers gather
get_buffer get_extra_state get_parameter get_submodule gradient_as_bucket_view half ipu
is_multi_device_module join join_device join_hook join_process_group load_state_dict logger
mixed_precision module modules modules_buffers mtia named_buffers named_children
named_module_buffers named_modules named_parameters no_sync output_device parameters
parameters_to_ignore process_group reducer register_backward_hook register_buffer
register_comm_hook register_forward_hook register_forward_pre_hook register_full_backward_hook
register_full_backward_pre_hook register_load_state_dict_post_hook
register_load_state_dict_pre_hook register_module register_parameter
register_state_dict_post_hook register_state_dict_pre_hook require_backward_grad_sync
require_forward_param_sync requires_grad_ scatter set_extra_state set_submodule share_memory
skip_all_reduce_unused_params state_dict static_graph to to_empty to_kwargs train training
type use_side_stream_for_tensor_copies will_sync_module_buffers xpu zero_grad
check_reduction gradient_predivide_factor ddp_uneven_inputs_config num_iterations
callback_queued comm_hook params hip
"""
DDP_ATTRS = frozenset(_DDP_NAMES.split())

# Another engine's API, which a program calls on the same name under a flag (DeepSpeed's
# `model.backward(loss)`, `model.step()`, `model.save_checkpoint(...)`): the name holds
# that engine there, not the DDP wrapper.
_ENGINE = frozenset(("backward", "step", "save_checkpoint", "load_checkpoint", "train_batch",
                     "eval_batch"))

_TORCH_DDP = ("torch.nn.parallel.DistributedDataParallel",
              "torch.nn.parallel.distributed.DistributedDataParallel")


class Access(NamedTuple):
    node: ast.Attribute     # `model.generate`
    holder: str             # "model", "self.model"
    wrapped_at: int         # the line of the wrap (or of the call that hands it in)
    chain: list[ast.AST]    # the nodes around the access in its function, outermost first
    func: Func | None


def missing_attributes(info: ModuleInfo) -> Iterator[Access]:
    """Each read of an attribute torch's wrapper lacks, on a name that holds the wrapper there:
    one the same function bound to the wrap on an earlier line and never rebinds after it
    (not in the other arm of the `if` that wraps), a `self.x` that every assignment in the
    class binds to the wrap, or a parameter every call in the files hands a wrapper. Not
    under `try`, nor in a function that asks `hasattr`/`isinstance` of the name. Only reads
    that a call goes through (`model.generate(...)`, `model.config.save(...)`): the calls
    the walker recorded, of the functions that hold the wrapper, and no walk of their own."""
    seen: set[int] = set()
    by_func = calls_by_func(info)
    for scope, holder, line, wrap in _holders(info):
        cands = _through(holder, [rec for func in scope for rec in
                                  by_func.get(id(func) if func is not None else 0, ())])
        if not cands:
            continue
        wrap_chain = _chain(info, *wrap) if wrap is not None else None
        if wrap is not None and wrap_chain is None:
            continue
        for node, rec in cands:
            func = rec.func
            top = func or info.tree
            if id(node) in seen or node.lineno <= line and wrap is not None and func is wrap[0]:
                continue
            chain = enclosing(func, info.tree, node)
            if chain is None or _excused([*chain, node], wrap_chain, holder) \
                    or _asks(top, holder) or _stored(info, holder, node.attr) \
                    or wrap is None and _rebinds(top, holder):
                continue
            seen.add(id(node))
            yield Access(node, holder, line, chain, func)


def _through(holder: str, recs: list[CallRec]) -> list[tuple[ast.Attribute, CallRec]]:
    """`holder.attr` where a call goes through it (`model.generate(...)`,
    `self.model.config.save(...)`), when the wrapper lacks `attr`."""
    out = []
    own = holder[5:] if "." in holder else ""
    for rec in recs:
        f, a, b = rec.node.func, None, None
        while type(f) is ast.Attribute:  # down to the root: `a` reads its attribute, `b` a's
            a, b, f = f, a, f.value
        if a is None or type(f) is not ast.Name:
            continue
        node = (b if f.id == "self" and a.attr == own else None) if own else (
            a if f.id == holder else None)
        if node is not None and node.attr not in DDP_ATTRS and node.attr not in _ENGINE \
                and not node.attr.startswith("_"):
            out.append((node, rec))
    return out


def _chain(info: ModuleInfo, func: Func | None, stmt: ast.AST) -> list[ast.AST] | None:
    """[the function (or module), nodes around the wrap, the wrap's statement]."""
    chain = enclosing(func, info.tree, stmt)
    return None if chain is None else [func or info.tree, *chain, stmt]


def _rebinds(fn: Func | ast.Module, name: str) -> bool:
    return stores(fn, name) > 0


Wrap = tuple[Func | None, ast.AST]   # the function that wraps, and the wrap's statement


def _holders(info: ModuleInfo) -> Iterator[tuple[list[Func | None], str, int, Wrap | None]]:
    """(functions to read, name, line of the wrap, where the wrap is: None for a parameter
    every call hands a wrapper)."""
    for name in info.ddp_names():
        entries = info.assigns.get(name, [])
        wraps = [(ln, v) for ln, v in entries if _torch_ddp(info, v)]
        for line, value in wraps:
            rec = info.call_rec(value) if isinstance(value, ast.Call) else None
            if rec is None:
                continue
            func, stmt = rec.func, rec.stmt or value
            if "." not in name:
                # rebound after the wrap in this function (`model = model.module`): no more
                rebound = [ln for ln, v in entries if ln > line and (ln, v) not in wraps
                           and _inside(func, ln)]
                if not rebound:
                    yield [func], name, line, (func, stmt)
            elif name.startswith("self.") and name.count(".") == 1 and func is not None:
                scope = _class_scope(info, func, entries, wraps)
                if scope:
                    yield scope, name, line, (func, stmt)
    for fns in info.funcs.values():
        for fn in fns:
            for param in info.handed_params.get(id(fn), ()):
                yield [fn], param, fn.lineno, None


def _class_scope(info: ModuleInfo, func: Func, entries: list[tuple[int, ast.expr]],
                 wraps: list[tuple[int, ast.expr]]) -> list[Func | None]:
    """The methods of the wrapping method's class, that one first, when every assignment to
    `self.x` in the class is a wrap; [] otherwise."""
    cls = info.classes.get(info.func_class.get(func, ""))
    if cls is None:
        return []
    lo, hi = cls.lineno, cls.end_lineno or cls.lineno
    if any(lo <= ln <= hi and (ln, v) not in wraps for ln, v in entries):
        return []
    return [func, *(f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                    and f is not func)]


def _inside(func: Func | None, line: int) -> bool:
    return func is None or func.lineno <= line <= (func.end_lineno or line)


def _torch_ddp(info: ModuleInfo, value: ast.expr) -> bool:
    return isinstance(value, ast.Call) and info.qualify(value.func) in _TORCH_DDP


def _excused(chain: list[ast.AST], wrap_chain: list[ast.AST] | None, holder: str) -> bool:
    """Under a `try` (a handler may expect the error); in an arm of a test whose other arm
    reads `<holder>.module` (`model.module.x if distributed else model.x`: the program tells
    the two apart); in the other arm of the `if` that wraps, or under a test that contradicts
    the wrap's (`if not args.sparse: emb = DDP(emb)` ... `if args.sparse: emb.sparse_emb`)."""
    for i, n in enumerate(chain[:-1]):
        if isinstance(n, ast.Try) and chain[i + 1] in n.body:
            return True
        if isinstance(n, ast.If | ast.IfExp) and _module_in(_other_arm(n, chain[i + 1]), holder):
            return True
    if not wrap_chain:
        return False
    for i, n in enumerate(wrap_chain[:-1]):
        if isinstance(n, ast.If) and n in chain:
            j = chain.index(n)
            if (wrap_chain[i + 1] in n.body) != (chain[j + 1] in n.body):
                return True
    known = _facts(wrap_chain)
    return any((key, not value) in known for key, value in _facts(chain))


def _other_arm(test: ast.If | ast.IfExp, inner: ast.AST) -> list[ast.AST]:
    if isinstance(test, ast.IfExp):
        return [test.orelse] if inner is test.body else [test.body]
    return list(test.orelse) if inner in test.body else list(test.body)


def _module_in(nodes: list[ast.AST], holder: str) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "module" and dotted(n.value) == holder
               for top in nodes for n in ast.walk(top))


def _facts(chain: list[ast.AST]) -> set[tuple[str, bool]]:
    """What the tests of the `if`s around the last node of `chain` must have been to get
    there: (the test's text, its truth), through `not`, and through `and` in a body."""
    out: set[tuple[str, bool]] = set()
    for i, n in enumerate(chain[:-1]):
        if isinstance(n, ast.If):
            _atoms(n.test, chain[i + 1] in n.body, out)
    return out


def _atoms(test: ast.expr, truth: bool, out: set[tuple[str, bool]]) -> None:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        _atoms(test.operand, not truth, out)
    elif isinstance(test, ast.BoolOp):
        if isinstance(test.op, ast.And) == truth:  # every part holds (and) or fails (or)
            for v in test.values:
                _atoms(v, truth, out)
    else:
        out.add((ast.dump(test), truth))


def _asks(func: Func | ast.Module, holder: str) -> bool:
    """`hasattr(model, ...)`, `isinstance(model, DDP)`, `getattr(model, ...)` in the
    function: it tells the wrapper from the model itself somewhere."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id in ("hasattr", "isinstance", "getattr") and n.args
               and dotted(n.args[0]) == holder for n in ast.walk(func))


def _stored(info: ModuleInfo, holder: str, attr: str) -> bool:
    """The program sets that attribute on the wrapper itself (`model.tag = ...`)."""
    return any(d == f"{holder}.{attr}" for d in info.assigns)
