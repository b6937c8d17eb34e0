"""DDP008 a wrapper checkpoint the script's own resume cannot read.

`ddp_model.state_dict()` passed to a save call (directly or via the dict it builds, under a
key), and the same module loads a checkpoint *strictly* into the unwrapped model (before the
wrap, `model.module`, `model_without_ddp`) from the same key: that resume fails with
missing/unexpected `module.` keys. A script that resumes into the same wrapper is consistent and
not reported. Nor is the bare model saved in the arm of the mode that never wraps (`if ddp:
save(m.module...) else: save(m...)`, with the wrap under `if ddp:`; whatever the wrap's test
reads, `num_gpus > 1`, `len(gpus) > 1`, matched by its structure and its names' bindings, in an
`if` or a conditional expression, negated or not), and a strict load counts
only when it reads the same model back (the same dict key, or the model under one of its names).
Nor where the script handles the prefix itself (`k.replace("module.", "")`, `k[7:]`,
`removeprefix`, `consume_prefix_in_state_dict_if_present`), or for the arm of a wrap test that
saves the bare model (`m.module.state_dict() if is_parallel(m) else m.state_dict()`), or where
the save and the load both spell out their file names and they differ (`net_meta.pth` saved,
`model_last.pth` loaded). Pitfall in [pitfalls.md](pitfalls.md). Fix:
`model.module.state_dict()`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
    dotted,
    exclusive,
    kwarg,
)
from ..analysis.wrap_condition import unwrapped_at
from ..registry import Hit, rule


@rule('DDP008', 'save-ddp-state-dict', 'warning',
      'state_dict() of the DDP wrapper is saved (keys get a `module.` prefix) and the same '
      'script loads it strictly into the unwrapped model',
      'save model.module.state_dict()')
def ddp008(info: ModuleInfo) -> Iterator[Hit]:
    """Only where the script's own loading cannot read it: the wrapper's state_dict (keys
    `module.*`) is saved, and the same module loads a checkpoint strictly into an unwrapped
    model (before the wrap, or `model.module`) under the key it was saved with."""
    ddp = info.ddp_names()
    if not ddp or _strips_prefix(info):
        return
    loads = _unwrapped_strict_loads(info, ddp)
    if not loads:
        return
    seen: set[int] = set()
    for rec in info.calls_named(*(n for n in info.call_lasts() if "save" in n.lower())):
        roots: list[ast.AST] = [*rec.node.args, *(k.value for k in rec.node.keywords)]
        for arg in list(roots):  # `ckpt = {...}; save(ckpt)`: the dict it was built from
            if isinstance(arg, ast.Name):
                roots.extend(v for _, v in info.assigns.get(arg.id, []))
        for root in roots:
            for key, node in _state_dicts(root):
                owner = dotted(node.func.value)  # type: ignore[attr-defined]
                if owner not in ddp or node.lineno <= ddp[owner] or id(node) in seen:
                    continue
                if _unwrapped_here(info, owner, node) or _wrap_tested(root, node):
                    continue
                # The load must read this model back: the same dict key, or (no key) the
                # same model under one of its names (`net`, `model.module`, `model`).
                names = _model_names(info, owner)
                hit = next((ld for k, ld in loads if k == key and (
                    k is not None or _load_owner(ld) in names)), None)
                if hit is None or _other_files(info, rec.node, hit):
                    continue
                seen.add(id(node))
                yield node, "DDP008", (
                    f"`{owner}.state_dict()` of the DDP wrapper is saved (every key gets a "
                    f"`module.` prefix), and line {hit.lineno} loads it strictly into the "
                    "unwrapped model: that resume fails with missing/unexpected keys")


_CKPT_EXT = (".pth", ".pt", ".ckpt", ".bin", ".tar", ".pkl", ".safetensors")


def _other_files(info: ModuleInfo, save: ast.Call, load: ast.Call) -> bool:
    """The save and the load name different files, both spelled out (`net_meta.pth` saved,
    `model_last.pth` loaded: PVDM, whose `model_last.pth` is written elsewhere): the load
    does not read what this save wrote."""
    saved = _file_names(info, save)
    loaded = set()
    for a in load.args[:1]:
        for v in info.values_of(a) or [a]:
            if isinstance(v, ast.Call) and info.callee_last(v) == "load":
                loaded |= _file_names(info, v)
    return bool(saved) and bool(loaded) and not saved & loaded


def _file_names(info: ModuleInfo, call: ast.Call) -> set[str]:
    out: set[str] = set()
    for a in [*call.args, *(k.value for k in call.keywords)]:
        for v in [a, *(x for _, x in info.assigns.get(dotted(a) or "", []))]:
            for n in ast.walk(v):
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    name = n.value.rsplit("/", 1)[-1]
                    if name.endswith(_CKPT_EXT) and name.split(".", 1)[0]:
                        out.add(name)
    return out


def _load_owner(load: ast.Call) -> str:
    owner = dotted(load.func.value) or ""  # type: ignore[attr-defined]
    return owner.removesuffix(".module")


def _model_names(info: ModuleInfo, owner: str) -> set[str]:
    """The names one wrapped model goes by: the wrapper, what was wrapped (`DDP(net)`), and
    what was taken out of it (`model_without_ddp = model.module`)."""
    names = {owner}
    for w in info.ddp_wraps(owner):
        if w.node.args:
            names.add(dotted(w.node.args[0]) or owner)
    inner = owner + ".module"
    names.update(n for n, vals in info.assigns.items() if any(dotted(v) == inner
                                                               for _, v in vals))
    return names


_PREFIX_CALLS = {"replace", "removeprefix", "lstrip", "sub", "startswith", "split",
                 "consume_prefix_in_state_dict_if_present"}


def _strips_prefix(info: ModuleInfo) -> bool:
    """The script handles the `module.` prefix itself somewhere (`k.replace("module.", "")`,
    `k[7:]`, `consume_prefix_in_state_dict_if_present`, `re.sub("^module.", ...)`): its resume
    reads a wrapper's checkpoint, so no saved state_dict is a finding."""
    hit = info._memo.get(("strips_prefix", 0))
    if hit is None:
        hit = any(r.last == "consume_prefix_in_state_dict_if_present" or (
            r.last in _PREFIX_CALLS and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str)
                and a.value.lstrip("^").startswith("module") for a in r.node.args))
            for r in info.calls) or any(
            isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice)
            and isinstance(n.slice.lower, ast.Constant) and n.slice.lower.value == 7
            and n.slice.upper is None for n in info.subscripts)
        info._memo[("strips_prefix", 0)] = hit
    return bool(hit)


def _wrap_tested(root: ast.AST, node: ast.Call) -> bool:
    """`m.module.state_dict() if is_parallel(m) else m.state_dict()`: the arm that runs when
    the model is not wrapped (a test of `isinstance(m, DDP)`, `hasattr(m, "module")`,
    `is_parallel(m)`) saves the bare model."""
    for n in ast.walk(root):
        if isinstance(n, ast.IfExp) and any(sub is node for sub in ast.walk(n.orelse)):
            text = ast.unparse(n.test).lower()
            if any(h in text for h in ("parallel", "module", "ddp", "distributed")):
                return True
    return False


def _unwrapped_here(info: ModuleInfo, owner: str, node: ast.Call) -> bool:
    """Every wrap of `owner` sits in an arm of a test whose opposite arm holds this
    `state_dict()` call: the other arm of the same `if`, or an arm of another `if` or of a
    conditional expression with the same test (wrap_condition.py): `if ddp: save(m.module.
    state_dict()) else: save(m.state_dict())` (MONAI's tutorials), `m.module.state_dict() if
    num_gpus > 1 else m.state_dict()` with the wrap under `if num_gpus > 1:`."""
    rec = info.call_rec(node)
    wraps = info.ddp_wraps(owner)
    if rec is None or not wraps:
        return False
    return all(exclusive(w, rec) or unwrapped_at(info, w, rec, node) for w in wraps)


def _state_dicts(root: ast.AST) -> Iterator[tuple[str | None, ast.Call]]:
    """`x.state_dict()` calls in a saved expression, with the dict key they are stored under."""
    if isinstance(root, ast.Dict):
        for k, v in zip(root.keys, root.values, strict=True):
            key = k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None
            for _, node in _state_dicts(v):
                yield key, node
        return
    for sub in ast.walk(root):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                and sub.func.attr == "state_dict":
            yield None, sub


def _unwrapped_strict_loads(info: ModuleInfo,
                            ddp: dict[str, int]) -> list[tuple[str | None, ast.Call]]:
    out = []
    for rec in info.calls_named("load_state_dict"):
        f = rec.node.func
        if not isinstance(f, ast.Attribute) or not rec.node.args:
            continue
        strict = kwarg(rec.node, "strict")
        if strict is not None and not (isinstance(strict, ast.Constant) and strict.value):
            continue
        owner = dotted(f.value) or ""
        wrapped = owner in ddp and rec.node.lineno > ddp[owner]
        if wrapped and not owner.endswith(".module"):
            continue
        arg = rec.node.args[0]
        key = arg.slice.value if isinstance(arg, ast.Subscript) and isinstance(
            arg.slice, ast.Constant) and isinstance(arg.slice.value, str) else None
        out.append((key, rec.node))
    return out


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args, local_rank):
    model = Net().cuda(local_rank)
    if args.resume:
        model.load_state_dict(torch.load(args.resume, map_location="cpu"))  # keys "fc.*"
    model = DDP(model, device_ids=[local_rank])
    train(model)
    torch.save(model.state_dict(), args.resume)  # keys "module.fc.*"
"""

RULE = ddp008
