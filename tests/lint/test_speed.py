"""Invariants the linter's speed work relies on (bench/lint.py measures the speed itself)."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

from ddpguard.lint import Selection, lint_file
from ddpguard.lint.analysis.walker import build

_SCRIPT = '''import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, net):
        self.model = DDP(net.cuda())
        self.rank = dist.get_rank()

    def fit(self, loader):
        for x in loader:
            self.model(x).sum().backward()
            if self.rank == 0:
                dist.barrier()
                torch.save(self.model.state_dict(), "a.pt")
        dist.all_reduce(torch.zeros(1).cuda())
'''


def test_lint_file_leaves_no_reference_cycles(tmp_path: Path) -> None:
    p = tmp_path / "train.py"
    p.write_text(_SCRIPT)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        assert lint_file(p, Selection(preview=True))
        assert gc.collect() == 0  # every file's summary freed by reference counting
    finally:
        if enabled:
            gc.enable()


def test_calls_named_keeps_call_order() -> None:
    info = build(ast.parse(_SCRIPT))
    for names in [("cuda",), ("barrier", "all_reduce", "save"), ("cuda", "nothing"), ()]:
        assert info.calls_named(*names) == [r for r in info.calls if r.last in names]
    assert sorted(info.call_lasts()) == sorted({r.last for r in info.calls})


def test_local_callees_from_the_recorded_name() -> None:
    info = build(ast.parse(_SCRIPT + "\n\ndef helper():\n    Trainer(None).fit([])\n"
                           "    helper()\n"))
    for rec in info.calls:
        f = rec.node.func
        want = info.funcs.get(f.id, []) if isinstance(f, ast.Name) else (
            info.funcs.get(f.attr, []) if isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name) and f.value.id in ("self", "cls") else [])
        assert info.local_callees(rec) == want
