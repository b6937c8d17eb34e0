"""DDP050 the local rank read only from a `--local_rank` option that today's launchers do not
pass.

`parser.add_argument("--local_rank", type=int, default=0)` was how the legacy
`torch.distributed.launch` handed each process its GPU. Since PyTorch 2.0 that launcher passes
`--local-rank=N` (with a dash), which a parser that declares only `--local_rank` does not know:
`parse_args()` stops every process with "unrecognized arguments: --local-rank=0", and
`parse_known_args()` sets it aside, so every process keeps the default. torchrun passes no
option at all (it exports `LOCAL_RANK`): every process keeps the default there too, so all of
them pick the same GPU (NCCL stops at its first collective on a duplicate GPU, or the
processes share one device) or, with a default of -1, each runs the single-process arm on the
whole dataset.

Reported at the declaration when no file given reads `LOCAL_RANK` from the environment, no file
assigns the option (`args.local_rank = int(os.environ[...])`, `setattr`, a config update), the
program starts no processes of its own (`mp.spawn`, whose index is the rank) and reads the
option somewhere, in a program that forms a process group (`init_process_group`, an
`init_distributed_mode()`). Fix: declare both spellings,
`add_argument("--local-rank", "--local_rank", type=int, default=0)`, or read
`int(os.environ["LOCAL_RANK"])`, which both launchers set.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import ModuleInfo, kwarg, option_names
from ..analysis.crossfile import sets_up_group
from ..analysis.options import project, stored
from ..registry import Hit, rule

_SPAWNS = ("spawn", "start_processes")


@rule('DDP050', 'local-rank-option-only', 'error',
      "the local rank comes only from a `--local_rank` option, which torchrun never passes and "
      "torch.distributed.launch (PyTorch 2.0 on) passes as `--local-rank`",
      'declare `--local-rank` too, or read `os.environ["LOCAL_RANK"]`')
def ddp050(info: ModuleInfo) -> Iterator[Hit]:
    decls = [r.node for r in info.calls_named("add_argument")
             if "local_rank" in option_names(r.node)]
    if len(decls) != 1 or not _grouped(info):
        return
    call = decls[0]
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if "--local_rank" not in flags or "--local-rank" in flags or kwarg(call, "dest") is not None:
        return
    files = project(info)
    if not any(sets_up_group(last) for m in files for last in m.call_lasts()):
        return
    if any(m.calls_named(*_SPAWNS) for m in files) or any(
            _environment(m) or stored(m, "local_rank") for m in files):
        return
    if not any(_read(m) for m in files):
        return
    default = kwarg(call, "default")
    keeps = (f"keeps the default `{ast.unparse(default)}`" if default is not None
             else "has no value (the option is required, or None)")
    parse = _parse(info)
    dashed = ("which parse_known_args() sets aside, so every process " + keeps
              if parse == "parse_known_args" else
              "which parse_args() rejects: every process exits with \"unrecognized arguments\"")
    value = _literal(default)
    acts = (" and acts as local rank 0 (one GPU for all of them, rank 0's writes on each)"
            if value == 0 else " and takes the path of a run without a launcher"
            if value == -1 else "")
    yield call, "DDP050", (
        f"the local rank comes only from the `--local_rank` option declared here, and nothing "
        f"reads LOCAL_RANK from the environment: torchrun passes no option (it exports "
        f"LOCAL_RANK), so every process {keeps}{acts}; torch.distributed.launch passes "
        f"`--local-rank=N` from PyTorch 2.0, {dashed}; declare both spellings "
        f"(`add_argument(\"--local-rank\", \"--local_rank\", ...)`) or read "
        f"`int(os.environ[\"LOCAL_RANK\"])`")


def _literal(node: ast.expr | None) -> object:
    """The option's default when written as a literal (`0`, `-1`), else None."""
    try:
        return ast.literal_eval(node) if node is not None else None
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _grouped(info: ModuleInfo) -> bool:
    fs = info.file_set
    return info.distributed or bool(fs is not None and getattr(fs, "multi", False)
                                    and fs.in_group(info))  # type: ignore[attr-defined]


def _environment(m: ModuleInfo) -> bool:
    """The file names LOCAL_RANK (an `os.environ` read, a default taken from it)."""
    return any(isinstance(n, ast.Constant) and n.value == "LOCAL_RANK" for n in ast.walk(m.tree))


def _read(m: ModuleInfo) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "local_rank"
               and isinstance(n.ctx, ast.Load) for n in ast.walk(m.tree))


def _parse(info: ModuleInfo) -> str:
    known = info.calls_named("parse_known_args")
    return "parse_known_args" if known and not info.calls_named("parse_args") else "parse_args"


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
torch.cuda.set_device(args.local_rank)
dist.init_process_group("nccl")
"""

RULE = ddp050
