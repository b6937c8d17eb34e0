"""Model, checkpoint and environment rules DDP008-DDP015."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from .context import ModuleInfo, dotted, is_true, kwarg

Hit = tuple[ast.AST, str, str]

_BAD_NCCL = re.compile(r"(?<![A-Z_])NCCL_(BLOCKING_WAIT|ASYNC_ERROR_HANDLING|TIMEOUT)\b")
_NCCL_FIX = {
    "BLOCKING_WAIT": "is deprecated: use TORCH_NCCL_BLOCKING_WAIT",
    "ASYNC_ERROR_HANDLING": "is deprecated: use TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TIMEOUT": "does not exist (neither NCCL nor torch reads it): pass "
               "init_process_group(timeout=timedelta(...))",
}


def ddp008(info: ModuleInfo) -> Iterator[Hit]:
    ddp = info.ddp_names()
    if not ddp:
        return
    for rec in info.calls:
        f = rec.node.func
        if rec.last != "state_dict" or not isinstance(f, ast.Attribute):
            continue
        owner = dotted(f.value)
        if owner in ddp and rec.node.lineno > ddp[owner]:
            yield rec.node, "DDP008", (f"`{owner}.state_dict()` is the DDP wrapper's: every key "
                                       "gets a `module.` prefix and a plain model cannot load it")


def ddp009(info: ModuleInfo) -> Iterator[Hit]:
    if not info.batchnorm:
        return
    wraps = [r for r in info.calls if r.last == "DistributedDataParallel"]
    converts = [r for r in info.calls if r.last == "convert_sync_batchnorm"]
    for w in wraps:
        if not converts:
            yield w.node, "DDP009", ("model with BatchNorm wrapped in DDP without "
                                     "SyncBatchNorm: each rank normalizes with its own statistics")
        elif all(c.node.lineno > w.node.lineno for c in converts if c.func is w.func) and \
                any(c.func is w.func for c in converts):
            yield w.node, "DDP009", ("convert_sync_batchnorm runs after DDP wrapping: "
                                     "convert first, then wrap")


def ddp010(info: ModuleInfo) -> Iterator[Hit]:
    for rec in info.calls:
        if rec.qual != "torch.load":
            continue
        missing = []
        if not is_true(kwarg(rec.node, "weights_only")):
            missing.append("weights_only=True (unpickling runs arbitrary code)")
        if info.distributed and kwarg(rec.node, "map_location") is None \
                and len(rec.node.args) < 2:
            missing.append("map_location (every rank loads onto the saving GPU)")
        if missing:
            yield rec.node, "DDP010", "torch.load without " + " and without ".join(missing)


def ddp011(info: ModuleInfo) -> Iterator[Hit]:
    for node in info.nccl_strings:
        m = _BAD_NCCL.search(str(node.value))
        if m:
            yield node, "DDP011", f"{m.group(0)} {_NCCL_FIX[m.group(1)]}"


def ddp012(info: ModuleInfo) -> Iterator[Hit]:
    inits = [r for r in info.calls if r.last == "init_process_group"]
    if inits and not any(r.last in ("destroy_process_group", "shutdown") for r in info.calls):
        yield inits[0].node, "DDP012", ("init_process_group without destroy_process_group: "
                                        "ranks can exit while others still wait on them")


def ddp013(info: ModuleInfo) -> Iterator[Hit]:
    if info.no_sync or not info.ddp_names():
        return
    for lrec in info.loops:
        for node in ast.walk(lrec.node):
            if not isinstance(node, ast.If) or not _has_modulo(node.test):
                continue
            for sub in node.body:
                for call in ast.walk(sub):
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                            and call.func.attr == "step" and "opt" in (
                                dotted(call.func.value) or "").lower():
                        yield call, "DDP013", ("optimizer steps every k iterations but the "
                                               "micro-steps all-reduce gradients anyway: use "
                                               "model.no_sync()")
                        return


def _has_modulo(test: ast.expr) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(test))


def ddp014(info: ModuleInfo) -> Iterator[Hit]:
    for rec in info.calls:
        if rec.last == "DataParallel":
            yield rec.node, "DDP014", ("nn.DataParallel: single-process, slower than DDP and "
                                       "deprecated for multi-GPU training")


def ddp015(info: ModuleInfo) -> Iterator[Hit]:
    ddp = info.ddp_names()
    for rec in info.calls:
        f = rec.node.func
        if rec.last in ("to", "cuda") and isinstance(f, ast.Attribute):
            owner = dotted(f.value)
            if owner in ddp and rec.node.lineno > ddp[owner]:
                yield rec.node, "DDP015", (f"`{owner}.{rec.last}()` after DDP wrapping: DDP "
                                           "already placed its buckets; move the model first")
        elif rec.last == "DistributedDataParallel" and info.uses_cuda and \
                kwarg(rec.node, "device_ids") is None and len(rec.node.args) < 2:
            yield rec.node, "DDP015", ("CUDA DDP without device_ids: pass "
                                       "device_ids=[local_rank] so each rank uses its own GPU")


RULES = {"DDP008": ddp008, "DDP009": ddp009, "DDP010": ddp010, "DDP011": ddp011,
         "DDP012": ddp012, "DDP013": ddp013, "DDP014": ddp014, "DDP015": ddp015}
