"""DDP048 an attribute of the wrapped model read on the DDP wrapper (fixture:
tests/lint/fixtures/DDP048_wrapper_attribute.py). Here: the rule's list of what torch's wrapper
has against the installed torch, a helper in another file, and what the message says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import lint_paths, lint_source

from ddpguard.lint import Selection
from ddpguard.lint.analysis.wrapper_attrs import DDP_ATTRS

ONLY = Selection(select=("DDP048",))


def test_the_list_holds_every_public_attribute_of_the_installed_torchs_wrapper(
        tmp_path: Path) -> None:
    # A name torch adds and the list lacks would be reported on correct code. A process of
    # its own: a group formed in the test process would leave its collectives in torch's
    # flight recorder for the guard's tests that run after it on the same worker.
    probe = textwrap.dedent(f"""\
        import json, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0,
                                world_size=1)
        try:
            w = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(2, 2),
                                                            torch.nn.BatchNorm1d(2)))
            print(json.dumps(sorted(n for n in set(dir(w)) | set(vars(w))
                                    if not n.startswith("_"))))
        finally:
            dist.destroy_process_group()
        """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert out.returncode == 0, out.stderr[-2000:]
    names = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert names - DDP_ATTRS == set()
    assert "generate" not in names and "module" in names


def test_a_helper_in_another_file_handed_the_wrapper(tmp_path: Path) -> None:
    (tmp_path / "utils.py").write_text(textwrap.dedent("""\
        def evaluate(model, data):
            return [model.predict(x) for x in data]
        """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from utils import evaluate


        def main(net, data, rank):
            dist.init_process_group("nccl")
            model = DDP(net, device_ids=[rank])
            for x in data:
                model(x).sum().backward()
            print(evaluate(model, data))
        """))
    found = lint_paths([tmp_path / "train.py", tmp_path / "utils.py"], ONLY)
    assert [(Path(f.path).name, f.line) for f in found] == [("utils.py", 2)]
    assert "every call hands `evaluate` a wrapper" in found[0].message
    assert "every rank that gets here dies" in found[0].message


def test_a_caller_that_unwraps_before_the_call_hands_the_bare_model(tmp_path: Path) -> None:
    # corpus39a's SGC-Net: `if args.distributed: model = model.module` just before
    # `evaluate(model, ...)`; the helper gets the model itself.
    (tmp_path / "engine.py").write_text(textwrap.dedent("""\
        def evaluate(model, data):
            return [model.encode_text(x) for x in data]
        """))
    (tmp_path / "main.py").write_text(textwrap.dedent("""\
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from engine import evaluate


        def main(net, data, args):
            dist.init_process_group("nccl")
            model = DDP(net, device_ids=[args.gpu])
            if args.eval:
                if args.distributed:
                    model = model.module
                print(evaluate(model, data))
        """))
    assert lint_paths([tmp_path / "main.py", tmp_path / "engine.py"], ONLY) == []


def test_the_message_says_who_dies_and_what_to_call() -> None:
    src = textwrap.dedent("""\
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel


        def main(net, rank):
            dist.init_process_group("nccl")
            model = DistributedDataParallel(net)
            if dist.get_rank() == 0:
                model.encode(1)
            dist.barrier()
        """)
    (f,) = lint_source(src, "train.py", ONLY)
    assert f.line == 9
    assert "no attribute `encode`" in f.message and "this call raises AttributeError" in f.message
    assert "only the ranks a rank test lets through" in f.message
    assert "`model.module.encode`" in f.message
