"""Whether the model a file wraps in DDP visibly has no buffers.

DDP's only collective in a forward under no_grad is the broadcast of the module's buffers
(running statistics, registered buffers). A forward on rank 0 alone under no_grad therefore
hangs only if the model has buffers. Where the wrapped model is built from a class of this
file, and that class (with the classes of this file it builds) holds only layers that keep no
buffers, the "if the model has buffers" premise is visibly false (graphlearn's HGT of PyG
`Linear`/`HGTConv` layers: run on 2 gloo ranks, no hang). Anything unknown (a model passed
in, a class from another package, a pretrained model) may have buffers: the answer is then no.
"""

from __future__ import annotations

import ast
import builtins

from .context import CallRec, ModuleInfo, dotted
from .divergence import Divergence, divergences

_MOVES = {"to", "cuda", "cpu", "float", "half", "bfloat16", "double", "train", "eval",
          "to_empty", "requires_grad_"}
# Layer libraries whose layers are known by name: a layer keeps buffers only if it is a
# normalization with running statistics.
_KNOWN = ("torch.nn.", "nn.", "torch_geometric.nn.")
_NO_BUFFER_NORMS = ("LayerNorm", "GroupNorm", "RMSNorm")
_BASES = {"Module", "nn.Module", "torch.nn.Module"}
# Model zoos: what they build (a ResNet, a BERT) has buffers more often than not.
_ZOOS = ("torchvision", "timm", "transformers", "torch.hub", "segmentation_models_pytorch")


def wrapped_model_has_no_buffers(info: ModuleInfo) -> bool:
    wraps = [r for r in info.calls if info.is_ddp_call(r.node)]
    if not wraps:
        return False
    for rec in wraps:
        arg = rec.node.args[0] if rec.node.args else next(
            (k.value for k in rec.node.keywords if k.arg == "module"), None)
        if arg is None:
            return False
        values = [v for v in (info.values_of(arg) or [arg]) if not info.is_ddp_call(v)]
        if not values or not all(_built_without_buffers(info, v) for v in values):
            return False
    return True


def _built_without_buffers(info: ModuleInfo, value: ast.expr) -> bool:
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in _MOVES:
        value = value.func.value
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return False
    return _class_without_buffers(info, value.func.id, set())


def _class_without_buffers(info: ModuleInfo, name: str, seen: set[str]) -> bool:
    cls = info.classes.get(name)
    if cls is None:
        return False
    if name in seen:
        return True
    seen.add(name)
    for base in cls.bases:
        b = dotted(base)
        if b is None or (b not in _BASES and not _class_without_buffers(info, b, seen)):
            return False
    # (`register_buffer` and BatchNorm anywhere in the file are the caller's test already.)
    for node in ast.walk(cls):
        if not isinstance(node, ast.Call):
            continue
        d = dotted(node.func)
        if d is None:
            if isinstance(node.func, ast.Call):
                return False  # built dynamically (`getattr(models, arch)(...)`)
            continue
        last = d.rsplit(".", 1)[-1]
        if "Norm" in last and not last.endswith(_NO_BUFFER_NORMS):
            return False
        if last in info.classes:
            if not _class_without_buffers(info, last, seen):
                return False
            continue
        qual = info.qualify(node.func) or d
        if qual.startswith(_ZOOS):
            return False
        if last[:1].isupper() and not qual.startswith(_KNOWN) and not hasattr(builtins, qual):
            # a layer or model from another package (or file): its buffers are not visible
            return False
    return True


def batchnorm_wraps(info: ModuleInfo) -> list[tuple[CallRec, list[CallRec]]]:
    """Each DDP wrap of a module that holds BatchNorm, with every SyncBatchNorm conversion of
    the file (DDP009 asks whether one comes after the wrap, DDP021 whether there is any)."""
    if not info.batchnorm:
        return []
    converts = [r for r in info.calls if r.last == "convert_sync_batchnorm"]
    return [(r, converts) for r in info.calls if r.last == "DistributedDataParallel"]


def rank_forwards(info: ModuleInfo) -> tuple[list[Divergence], bool]:
    """The forwards through the DDP wrapper on some rank classes only that can hang (DDP006
    and DDP037 read them), and whether DDP's buffer broadcast visibly makes them hang: the
    program visibly has buffers (a BatchNorm or `register_buffer` in any file linted with
    this one) and no wrap passes `broadcast_buffers=False`."""
    key = ("rank_forwards",)
    hit = info._memo.get(key)
    if hit is None:
        hit = info._memo[key] = _rank_forwards(info)
    return hit  # type: ignore[return-value]


def _rank_forwards(info: ModuleInfo) -> tuple[list[Divergence], bool]:
    found = [d for d in divergences(info) if d.code == "DDP006"]
    if found and _buffers_maybe_unsynced(info):
        # Under no_grad a forward's only collective is the buffer broadcast; with
        # `broadcast_buffers` set from a config (modulus: False by default) that is unproven.
        found = [d for d in found if not d.no_grad]
    if found and all(d.no_grad for d in found) and not visible_buffers(info) \
            and wrapped_model_has_no_buffers(info):
        # Under no_grad the buffer broadcast is the forward's one collective, and the model
        # is built, visibly, from layers without buffers.
        found = []
    proven = bool(found) and visible_buffers(info) and not any(
        isinstance(k.value, ast.Constant) and k.value.value is False
        for r in info.calls if r.last == "DistributedDataParallel" or r.last.endswith("_DDP")
        for k in r.node.keywords if k.arg == "broadcast_buffers")
    return found, proven


def visible_buffers(info: ModuleInfo) -> bool:
    """A BatchNorm layer or a `register_buffer` call in this file or any file linted with
    it."""
    return any(m.batchnorm or any(r.last == "register_buffer" for r in m.calls)
               for m in getattr(info.file_set, "infos", None) or [info])


def _buffers_maybe_unsynced(info: ModuleInfo) -> bool:
    """Every DDP wrap of the module passes `broadcast_buffers=` something other than a
    literal True."""
    wraps = [r for r in info.calls if r.last == "DistributedDataParallel" or r.last == "DDP"]
    return bool(wraps) and all(any(
        k.arg == "broadcast_buffers" and not (isinstance(k.value, ast.Constant)
                                              and k.value.value is True)
        for k in r.node.keywords) for r in wraps)
