"""Building an instance of a class of the file runs its `__init__`: a constructor that wraps
the model in DDP (or makes a collective) is a call that reaches one (MS-G3D's
`processor = Processor(arg)`); a class whose constructor makes none is not."""

from __future__ import annotations

import textwrap

from ddpguard.lint.analysis.collective_reach import reaches_collective
from ddpguard.lint.analysis.context import ModuleInfo
from ddpguard.lint.engine import analyse

SRC = textwrap.dedent("""\
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Processor:
        def __init__(self, arg):
            self.model = DDP(torch.nn.Linear(2, 2))
            dist.barrier()


    class Plain:
        def __init__(self, arg):
            self.arg = arg


    def main(arg):
        a = Processor(arg)
        b = Plain(arg)
""")


def test_a_constructor_that_makes_a_collective_reaches_one() -> None:
    info = analyse(SRC, "m.py")
    assert isinstance(info, ModuleInfo)
    by_name = {r.last: r for r in info.calls if r.last in ("Processor", "Plain")}
    assert reaches_collective(info, by_name["Processor"])
    assert not reaches_collective(info, by_name["Plain"])
