"""DDP010 torch.load.

Since torch 2.6 `torch.load` defaults to `weights_only=True`, so the advice depends on the torch
versions the project supports, read from the nearest `pyproject.toml` (`[project] dependencies`
torch lower bound; a `requires-python` that no older torch supports raises it). Reported: an
explicit `weights_only=False` on a non-literal path (a crafted file runs code on every rank); a
missing `weights_only` on a non-literal path where the project allows torch < 2.6; a missing
`map_location` in a CUDA DDP script (every rank restores onto the GPU that saved, usually
cuda:0) unless a sibling branch passes one. Calls with `**kwargs` are left to their caller. The
map_location case covers every module that uses `torch.distributed` (not only visibly-CUDA ones;
a gloo-only CPU script is exempt), and skips loads under a rank test (rank 0 restores onto its
own GPU) and per-rank paths. Off by default: 1 of its 2 first findings on unseen code was true
(`--extend-select DDP010`). Fix: `torch.load(p, map_location=device, weights_only=True)`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import (
    CallRec,
    ModuleInfo,
    exclusive,
    kwarg,
)
from ..analysis.paths import per_rank_path
from ..registry import Hit, rule


@rule('DDP010', 'unsafe-torch-load', 'warning',
      'torch.load with weights_only=False on a non-literal path, without weights_only where '
      'the project supports torch < 2.6, or without map_location in a module that uses '
      'torch.distributed',
      'torch.load(path, map_location=device, weights_only=True)', default=False)
def ddp010(info: ModuleInfo) -> Iterator[Hit]:
    """Advice that is true for the torch versions the project supports: since torch 2.6
    `weights_only` defaults to True, so only an explicit False, or a project that still
    supports older torch, unpickles arbitrary objects."""
    loads = [r for r in info.calls if r.qual == "torch.load"]
    for rec in loads:
        call = rec.node
        if any(k.arg is None for k in call.keywords):
            continue  # `**kwargs`: the caller decides; nothing to see here
        path = call.args[0] if call.args else kwarg(call, "f")
        external = path is not None and not _constant_path(path)
        wo = kwarg(call, "weights_only")
        src = f"`{ast.unparse(path)}`" if path is not None else "the file"
        if isinstance(wo, ast.Constant) and wo.value is False and external:
            yield call, "DDP010", (f"torch.load(weights_only=False) unpickles whatever {src} "
                                   "holds: a crafted file runs code on every rank that loads it")
        elif wo is None and external and info.torch_floor is not None \
                and info.torch_floor < (2, 6):
            floor = "< 2.6" if info.torch_floor == (0, 0) else \
                f">= {info.torch_floor[0]}.{info.torch_floor[1]}"
            yield call, "DDP010", (f"the project allows torch {floor} (pyproject.toml), where "
                                   "torch.load defaults to weights_only=False (before 2.6): "
                                   f"loading {src} unpickles arbitrary objects")
        elif info.distributed and not _gloo_only(info) and kwarg(call, "map_location") is None \
                and not info.effective_guard(rec) \
                and len(call.args) < 2 and not _sibling_maps(rec, loads) \
                and not (path is not None and per_rank_path(info, path)):
            yield call, "DDP010", ("torch.load without map_location in a module that uses "
                                   "torch.distributed: every rank restores CUDA tensors onto "
                                   "the GPU that saved them (usually cuda:0), whatever "
                                   "torch's weights_only default; that GPU pays the memory "
                                   "or OOMs")


def _gloo_only(info: ModuleInfo) -> bool:
    """A "gloo" backend spelled and no CUDA anywhere: a CPU script, where every rank's load
    lands in its own memory."""
    return "gloo" in info.spelled and not info.uses_cuda


def _constant_path(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return True
    return isinstance(node, ast.JoinedStr) and all(
        isinstance(v, ast.Constant) for v in node.values)


def _sibling_maps(rec: CallRec, loads: list[CallRec]) -> bool:
    """`if gpu is None: torch.load(p) else: torch.load(p, map_location=loc)`: the author
    chose per branch (the first serves the one-process-per-node / CPU launch)."""
    return any(o is not rec and kwarg(o.node, "map_location") is not None and exclusive(rec, o)
               for o in loads)


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
state = torch.load(args.ckpt, map_location="cpu", weights_only=False)
"""

RULE = ddp010
