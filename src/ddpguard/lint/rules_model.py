"""Model and environment rules DDP009-DDP015, DDP021 and DDP023 (DDP008, the checkpoint the
resume cannot read, is rules_ckpt.py)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from .context import CallRec, ModuleInfo, dominates, dotted, exclusive, kwarg
from .paths import per_rank_path
from .registry import Hit, rule

_BAD_NCCL = re.compile(r"(?<![A-Z_])NCCL_(BLOCKING_WAIT|ASYNC_ERROR_HANDLING|TIMEOUT)\b")
_NCCL_FIX = {
    "BLOCKING_WAIT": "is deprecated (torch still reads it and warns): use "
                     "TORCH_NCCL_BLOCKING_WAIT",
    "ASYNC_ERROR_HANDLING": "is deprecated (torch still reads it and warns): use "
                            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TIMEOUT": "does not exist (neither NCCL nor torch reads it): pass "
               "init_process_group(timeout=timedelta(...))",
}


@rule('DDP009', 'syncbatchnorm-after-wrap', 'warning',
      'convert_sync_batchnorm runs after the model was wrapped in DDP',
      'model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP(model)')
def ddp009(info: ModuleInfo) -> Iterator[Hit]:
    """The conversion builds new modules after DDP registered the old ones: convert, then
    wrap (docs/pitfalls.md)."""
    for w, converts in _bn_wraps(info):
        if converts and all(c.node.lineno > w.node.lineno for c in converts
                            if c.func is w.func) and any(c.func is w.func for c in converts):
            yield w.node, "DDP009", ("convert_sync_batchnorm runs after DDP wrapping: "
                                     "convert first, then wrap")


@rule('DDP021', 'batchnorm-local-statistics', 'info',
      'a BatchNorm model wrapped in DDP and never converted to SyncBatchNorm',
      'model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP(model), where the '
      'per-rank batch is small', default=False)
def ddp021(info: ModuleInfo) -> Iterator[Hit]:
    """Off by default: each rank normalizing with its own batch statistics is a deliberate,
    common choice (torchvision's references make SyncBatchNorm a flag); it matters when the
    per-rank batch is small, which the code rarely shows."""
    for w, converts in _bn_wraps(info):
        if not converts:
            yield w.node, "DDP021", ("model with BatchNorm wrapped in DDP without "
                                     "SyncBatchNorm: each rank normalizes with its own statistics")


def _bn_wraps(info: ModuleInfo) -> list[tuple[CallRec, list[CallRec]]]:
    if not info.batchnorm:
        return []
    converts = [r for r in info.calls if r.last == "convert_sync_batchnorm"]
    return [(r, converts) for r in info.calls if r.last == "DistributedDataParallel"]


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
        elif info.distributed and not info.gloo_only and kwarg(call, "map_location") is None \
                and not info.effective_guard(rec) \
                and len(call.args) < 2 and not _sibling_maps(rec, loads) \
                and not (path is not None and per_rank_path(info, path)):
            yield call, "DDP010", ("torch.load without map_location in a module that uses "
                                   "torch.distributed: every rank restores CUDA tensors onto "
                                   "the GPU that saved them (usually cuda:0), whatever "
                                   "torch's weights_only default; that GPU pays the memory "
                                   "or OOMs")


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


@rule('DDP011', 'bad-nccl-variable', 'warning',
      'an NCCL variable that does not exist (NCCL_TIMEOUT: neither NCCL nor torch reads it)',
      'timeouts go in init_process_group(timeout=...)')
def ddp011(info: ModuleInfo) -> Iterator[Hit]:
    for node, name in _nccl_settings(info):
        if name == "TIMEOUT":
            yield node, "DDP011", f"NCCL_TIMEOUT {_NCCL_FIX[name]}"


@rule('DDP023', 'deprecated-nccl-variable', 'info',
      'a deprecated NCCL variable that torch still reads (NCCL_BLOCKING_WAIT, '
      'NCCL_ASYNC_ERROR_HANDLING)',
      'use TORCH_NCCL_BLOCKING_WAIT / TORCH_NCCL_ASYNC_ERROR_HANDLING', default=False)
def ddp023(info: ModuleInfo) -> Iterator[Hit]:
    """Off by default since issue 20's sixth round: torch 2.13 still reads the old names and
    only warns (reviewers called 3 of 4 such findings debatable); a rename, not a bug."""
    for node, name in _nccl_settings(info):
        if name != "TIMEOUT":
            yield node, "DDP023", f"NCCL_{name} {_NCCL_FIX[name]}"


def _nccl_settings(info: ModuleInfo) -> Iterator[tuple[ast.Constant, str]]:
    for node in info.nccl_strings:
        text = str(node.value)
        m = _BAD_NCCL.search(text)
        # The variable itself (`os.environ["NCCL_BLOCKING_WAIT"]`) or set in a command
        # (`NCCL_BLOCKING_WAIT=1 python ...`); not prose that names it (a --help text).
        if m and (text.strip() == m.group(0) or text[m.end():m.end() + 1] == "="):
            yield node, m.group(1)


@rule('DDP012', 'missing-destroy', 'warning',
      'a training script initializes a process group and never destroys it',
      'call dist.destroy_process_group() on the way out (try/finally)', default=False)
def ddp012(info: ModuleInfo) -> Iterator[Hit]:
    """Off by default: a reviewer of real scripts judged 0 of 13 first-contact findings worth
    acting on (hygiene, a warning at exit; no rank of those scripts can leave early)."""
    # A helper module's `init_distributed_mode()` cannot tear down what its caller still
    # uses; the finding belongs in the script (a DDP wrap or a `__main__` block).
    if not (info.has_main or info.wraps_ddp):
        return
    # A one-process group (`world_size=1`, a HashStore, accelerate's single-GPU fallback) and
    # a connectivity test worker (`_test_nccl_worker`) exit without peers to leave waiting.
    inits = [r for r in info.calls if r.last == "init_process_group" and not _solo(r)
             and not (r.func is not None and "test" in r.func.name.lower())]
    if inits and not any(r.last in ("destroy_process_group", "shutdown") for r in info.calls):
        yield inits[0].node, "DDP012", (
            "the process group is never destroyed: torch (2.4+) warns at exit that pending "
            "NCCL work may not have finished, and a rank that exits first can leave a peer "
            "blocked in a collective")


def _solo(rec: CallRec) -> bool:
    ws = kwarg(rec.node, "world_size")
    store = kwarg(rec.node, "store")
    return (isinstance(ws, ast.Constant) and ws.value == 1) or (
        isinstance(store, ast.Call) and (dotted(store.func) or "").endswith("HashStore"))


@rule('DDP014', 'data-parallel', 'warning',
      'nn.DataParallel as the multi-GPU strategy (one GIL-bound process, slower than DDP)',
      'use DistributedDataParallel with one process per device', default=False)
def ddp014(info: ModuleInfo) -> Iterator[Hit]:
    """A choice of strategy, not a bug: off by default since issue 20's fourth round (0 true
    in 8 findings on real code: fallbacks of DDP scripts, other frameworks' wrappers)."""
    # In a script that also wraps in DDP, DataParallel is the single-process fallback branch
    # (pytorch/examples' imagenet, yolov5): a deliberate choice, not a finding.
    if info.wraps_ddp:
        return
    for rec in info.calls:
        # torch's nn.DataParallel only: paddle.DataParallel is one process per device.
        if rec.last == "DataParallel" and not (rec.qual or info.qualify(rec.node.func) or
                                               "").startswith(_NOT_TORCH):
            yield rec.node, "DDP014", (
                "nn.DataParallel runs every GPU from one process: threads bound by the GIL, "
                "the model replicated and outputs gathered on the first GPU each step, "
                "markedly slower than DistributedDataParallel")


_NOT_TORCH = ("paddle", "mindspore", "jittor", "oneflow", "tensorflow", "mxnet")


@rule('DDP015', 'ddp-device-placement', 'warning',
      'model moved after DDP wrapping on the same path, or DDP without device_ids on a model '
      'placed with a bare .cuda() and no set_device',
      'move the model to its device first, then DDP(model, device_ids=[local_rank])',
      preview=True)
def ddp015(info: ModuleInfo) -> Iterator[Hit]:
    """A model on the wrong device fails at the wrap or trains on one GPU. A preview rule
    since issue 20's twelfth round: first contact 0 true, 2 false, 1 debatable."""
    ddp = info.ddp_names()
    set_devices = info.calls_named("set_device")
    for rec in info.calls_named("to", "cuda", "DistributedDataParallel"):
        f = rec.node.func
        if rec.last in ("to", "cuda") and isinstance(f, ast.Attribute):
            owner = dotted(f.value)
            # Only a wrap on every path to this call counts: a `.cuda()` in the sibling
            # `else` (or in the DataParallel / CPU branch) never meets that wrapper.
            # `DDP(model.cuda(), ...)`: a move inside the wrap's own arguments comes first.
            if owner in ddp and any(dominates(w, rec) and not _within(rec.node, w.node)
                                    and not _moved_there_before(info, rec, w)
                                    for w in info.ddp_wraps(owner)):
                yield rec.node, "DDP015", (f"`{owner}.{rec.last}()` after DDP wrapping: DDP "
                                           "already placed its buckets; move the model first")
        elif rec.last == "DistributedDataParallel" and info.uses_cuda and \
                not any(k.arg is None for k in rec.node.keywords) and \
                kwarg(rec.node, "device_ids") is None and len(rec.node.args) < 2 and \
                _bare_cuda(info, rec) and not _placed_per_rank(info, rec, set_devices):
            yield rec.node, "DDP015", (
                "DDP without device_ids on a model placed with a bare .cuda() and no "
                "torch.cuda.set_device on this path: every process of a node uses the current "
                "device (cuda:0); DDP has not spread one process over several GPUs since "
                "torch 1.9")


def _is_bare_move(call: ast.Call) -> bool:
    """`.cuda()` or `.to("cuda")`: the current device, whichever that is."""
    if not isinstance(call.func, ast.Attribute) or call.keywords:
        return False
    if call.func.attr == "cuda":
        return not call.args
    return call.func.attr == "to" and len(call.args) == 1 and \
        isinstance(call.args[0], ast.Constant) and call.args[0].value == "cuda"


def _bare_cuda(info: ModuleInfo, wrap: CallRec) -> bool:
    """The wrapped model is visibly placed with a bare `.cuda()` on the way to the wrap (in
    its arguments, or earlier in the same function). A model the caller placed is no
    evidence of cuda:0 (physicsnemo wraps a parameter that its caller moved)."""
    arg = wrap.node.args[0] if wrap.node.args else kwarg(wrap.node, "module")
    if isinstance(arg, ast.Call):
        return _is_bare_move(arg)
    name = dotted(arg) if arg is not None else None
    return name is not None and any(
        _is_bare_move(rec.node) and isinstance(rec.node.func, ast.Attribute)
        and dotted(rec.node.func.value) == name and rec.func is wrap.func
        and rec.node.lineno <= wrap.node.lineno and not exclusive(rec, wrap)
        for rec in info.calls_named("to", "cuda"))


def _moved_there_before(info: ModuleInfo, move: CallRec, wrap: CallRec) -> bool:
    """`model.to(device)` before the wrap and the same `model.to(device)` after it: the second
    is a no-op (Megatron's example after loading a checkpoint in place)."""
    owner = dotted(move.node.func.value) if isinstance(move.node.func, ast.Attribute) else None
    args = [ast.unparse(a) for a in move.node.args]
    for rec in info.calls:
        f = rec.node.func
        if rec.last == move.last and isinstance(f, ast.Attribute) and rec.func is wrap.func \
                and dotted(f.value) == owner and rec.node.lineno < wrap.node.lineno \
                and [ast.unparse(a) for a in rec.node.args] == args and not exclusive(rec, wrap):
            return True
    return False


def _within(node: ast.AST, outer: ast.AST) -> bool:
    return any(n is node for n in ast.walk(outer))


def _placed_per_rank(info: ModuleInfo, wrap: CallRec, set_devices: list[CallRec]) -> bool:
    if any(not exclusive(s, wrap) for s in set_devices):
        return True
    # The other arm of the same test wraps with device_ids and this one moves nothing to a
    # GPU: this arm is the CPU path (torchdrug's `if self.device.type == "cuda": DDP(m,
    # device_ids=[...]) else: DDP(m)`; imagenet's `else: model.cuda(); DDP(model)` is not).
    # Also with a bare `.cuda()` here: the pytorch/examples fallback (`if args.gpu is not
    # None: ... DDP(model, device_ids=[args.gpu]) else: model.cuda(); DDP(model)`) serves a
    # launch that names no device (one process per node); the per-process launch the
    # projects document takes the other arm. Independent reviewers judged it debatable or
    # false 4 times in 4 (SWAG, NeWCRFs, PCL twice) since issue 13's review.
    if any(kwarg(w.node, "device_ids") is not None and exclusive(w, wrap)
           for w in info.calls_named("DistributedDataParallel")):
        return True
    # The group is formed in another file on the command line that sets the device there
    # (dinov2's `distributed.enable()`): this path cannot be shown to lack it.
    if getattr(info.project, "sets_device", False) and not set_devices:
        return True
    # `DDP(model.to(local_rank))`, or `model.cuda(gpu)` on the way: placed on a chosen device
    arg = wrap.node.args[0] if wrap.node.args else kwarg(wrap.node, "module")
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute):
        return arg.func.attr in ("to", "cuda") and bool(arg.args or arg.keywords) \
            and not _is_bare_move(arg)
    name = dotted(arg) if arg is not None else None
    for rec in info.calls_named("to", "cuda"):
        f = rec.node.func
        if rec.last in ("to", "cuda") and isinstance(f, ast.Attribute) \
                and dotted(f.value) == name and (rec.node.args or rec.node.keywords) \
                and not _is_bare_move(rec.node) \
                and rec.func is wrap.func and not exclusive(rec, wrap) \
                and rec.node.lineno <= wrap.node.lineno:
            return True
    return False


RULES = [ddp021, ddp009, ddp010, ddp011, ddp012, ddp014, ddp015, ddp023]
