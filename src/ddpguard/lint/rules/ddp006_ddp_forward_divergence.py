"""DDP006 ddp-forward-divergence."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.buffers import wrapped_model_has_no_buffers
from ..analysis.context import (
    ModuleInfo,
)
from ..analysis.divergence import divergences
from ..registry import At, Hit, rule


@rule("DDP006", "ddp-forward-divergence", "error",
      "forward of the DDP-wrapped model on some rank classes only (directly or in a helper); "
      "error when the module visibly has buffers (BatchNorm)",
      "evaluate on every rank, or call model.module(...) on rank 0")
def ddp006(info: ModuleInfo) -> Iterator[Hit]:
    """DDP broadcasts the module's buffers at the start of each forward and waits for every
    rank: a forward on rank 0 alone hangs as soon as the model has a buffer (docs/pitfalls.md)."""
    found = [d for d in divergences(info) if d.code == "DDP006"]
    if found and _buffers_maybe_unsynced(info):
        # Under no_grad a forward's only collective is the buffer broadcast; with
        # `broadcast_buffers` set from a config (modulus: False by default) that is unproven.
        found = [d for d in found if not d.no_grad]
    if found and all(d.no_grad for d in found) and not (info.batchnorm or info.buffers) \
            and wrapped_model_has_no_buffers(info):
        # Under no_grad the buffer broadcast is the forward's one collective, and the model
        # is built, visibly, from layers without buffers.
        found = []
    if not found:
        return
    sev = "error" if (info.batchnorm or info.buffers) and not any(
        isinstance(k.value, ast.Constant) and k.value.value is False
        for r in info.calls if r.last == "DistributedDataParallel" or r.last.endswith("_DDP")
        for k in r.node.keywords if k.arg == "broadcast_buffers") else "warning"
    tail = ("; DDP broadcasts the module's buffers (visible in this file) before this "
            "forward and waits for the other ranks, which make no matching broadcast: it hangs") \
        if sev == "error" else (
            "; if the model has buffers (e.g. BatchNorm) and broadcast_buffers is on, DDP "
            "broadcasts them before this forward and waits for the other ranks, which make no "
            "matching broadcast: it hangs")
    for d in found:
        yield At(d.line), "DDP006", d.message + tail, sev


def _buffers_maybe_unsynced(info: ModuleInfo) -> bool:
    """Every DDP wrap of the module passes `broadcast_buffers=` something other than a
    literal True."""
    wraps = [r for r in info.calls if r.last == "DistributedDataParallel" or r.last == "DDP"]
    return bool(wraps) and all(any(
        k.arg == "broadcast_buffers" and not (isinstance(k.value, ast.Constant)
                                              and k.value.value is True)
        for k in r.node.keywords) for r in wraps)


RULE = ddp006
