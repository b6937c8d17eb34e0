"""DDP006 DDP forward on some ranks only.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

import dataclasses

import helpers
from helpers import LINT_FIXTURES, ddp_source, lint_with_defaults

# Most tests here are about which forwards the analysis reports. DDP006 (buffers visible in
# the program) and DDP037 (none visible; preview) report the same forwards and differ only in
# that premise, which test_the_forward_finding_splits_on_visible_buffers checks; elsewhere
# both read as "DDP006", the forward finding.


def _forward(code: str) -> str:
    return "DDP006" if code == "DDP037" else code


def lint_source(src: str, *args, **kwargs):  # type: ignore[no-untyped-def]
    return [dataclasses.replace(f, code=_forward(f.code))
            for f in helpers.lint_source(src, *args, **kwargs)]


def finding_lines(src: str) -> list[tuple[str, int]]:
    return [(_forward(c), line) for c, line in helpers.finding_lines(src)]


def snippet_lines(src: str) -> list[tuple[str, int]]:
    return [(_forward(c), line) for c, line in helpers.snippet_lines(src)]


def cache_leader_lines(*edits: str) -> list[tuple[str, int]]:
    return [(_forward(c), line) for c, line in helpers.cache_leader_lines(*edits)]


def test_the_forward_finding_splits_on_visible_buffers() -> None:
    source = (LINT_FIXTURES / "DDP006_eval_helper.py").read_text(encoding="utf-8")
    # No buffer visible: DDP037, a preview rule, not shown by default.
    assert lint_with_defaults(source) == []
    [f] = helpers.lint_source(source)
    assert (f.code, f.severity) == ("DDP037", "warning") and "call at line 29" in f.message
    assert "if the model has buffers" in f.message
    # A BatchNorm in the model: DDP006, on by default.
    with_bn = source.replace("torch.nn.ReLU()", "torch.nn.BatchNorm1d(8)")
    assert [(f.code, f.severity) for f in lint_with_defaults(with_bn)] == [("DDP006", "error")]
    # The same BatchNorm in another file linted with it counts too.
    # (tests/lint/test_project.py); broadcast_buffers=False makes it unproven again.
    quiet = with_bn.replace(
        "device_ids=[ddp_local_rank])", "device_ids=[ddp_local_rank], broadcast_buffers=False)"
    )
    assert lint_with_defaults(quiet) == []
    assert [f.code for f in helpers.lint_source(quiet)] == ["DDP037"]


def test_parameter_forward_binds_to_the_ddp_model() -> None:
    src = """
    def validate(net, x):
        return net(x)
    model = DDP(torch.nn.Linear(2, 2))
    if dist.get_rank() == 0:
        validate(model, x)
    validate(model.module, x)
    """
    assert snippet_lines(src) == [("DDP006", 6)]


# Evaluation with gradients on: a forward under no_grad on rank 0 alone pairs its one buffer
# broadcast with the others' next training forward, so these checks of which
# arm runs and which name holds the wrapper evaluate with gradients.
GRAD_ON = (
    "    with torch.no_grad():\n        return model(feats).mean().item()\n",
    "    if True:\n        return model(feats).mean().item()\n",
)


def test_the_single_process_arm_is_never_taken_in_a_distributed_run() -> None:
    # `args.local_rank == -1` is false on every rank once launched: the evaluation under it
    # (which runs the leader-first cache load) is no rank-0-only collective. Drop the test
    # and rank 0 forwards the DDP model alone.
    assert not [c for c in cache_leader_lines(*GRAD_ON) if c[0] == "DDP006"]
    got = cache_leader_lines(
        "            if args.local_rank == -1 and args.eval_during_training:\n",
        "            if args.eval_during_training:\n",
        *GRAD_ON,
    )
    assert ("DDP006", 48) in got


def test_a_local_name_holds_the_wrapper_only_where_it_was_wrapped() -> None:
    # main() evaluates a fresh `model` on rank 0 only: not the wrapper of train().
    assert not [c for c in cache_leader_lines(*GRAD_ON) if c[0] == "DDP006"]
    # Rank 0 evaluating the wrapped model inside train() is a forward of the wrapper.
    got = cache_leader_lines(
        "            if args.local_rank == -1 and args.eval_during_training:\n"
        "                print(evaluate(args, model))\n",
        "            print(evaluate(args, model))\n",
        *GRAD_ON,
    )
    assert ("DDP006", 47) in got
    # Under no_grad its one broadcast pairs with the others' next training forward.
    assert not [
        c
        for c in cache_leader_lines(
            "            if args.local_rank == -1 and "
            "args.eval_during_training:\n"
            "                print(evaluate(args, model))\n",
            "            print(evaluate(args, model))\n",
        )
        if c[0] == "DDP006"
    ]


EVAL_IN_LOOP = ddp_source("""
    def train(model, loader, val, rank):
        model = DDP(model, device_ids=[rank])
        for step, x in enumerate(loader):
            model(x).sum().backward()
            if rank == 0 and step % 100 == 0:
                with torch.no_grad():
                    model(val)
    """)


def test_a_no_grad_forward_on_rank_0_pairs_with_the_next_training_forward() -> None:
    # Its one buffer broadcast meets the others' broadcast at the next iteration's forward
    # (and it clears the flag that would make rank 0's own next forward sync again).
    assert [f.code for f in lint_source(EVAL_IN_LOOP)] == []
    # With gradients on, rank 0 syncs once more than the others: a hang.
    grad_on = EVAL_IN_LOOP.replace("with torch.no_grad():", "if True:")
    assert [f.code for f in lint_source(grad_on)] == ["DDP006"]
    # Under no_grad too, when the others go on to another collective first.
    barrier = EVAL_IN_LOOP.replace(
        "                model(val)\n", "                model(val)\n        dist.barrier()\n"
    )
    assert [f.code for f in lint_source(barrier)] == ["DDP006"]


def test_no_grad_around_the_call_covers_the_helpers_forward() -> None:
    src = ddp_source("""
        def evaluate(model, val):
            return model(val).mean()

        def train(model, loader, val, rank):
            model = DDP(model, device_ids=[rank])
            for step, x in enumerate(loader):
                model(x).sum().backward()
                if rank == 0 and step % 100 == 0:
                    with torch.no_grad():
                        evaluate(model, val)
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("with torch.no_grad():", "if True:"))] == [
        "DDP006"
    ]


def test_no_grad_around_a_method_call_covers_its_forward_of_self_model() -> None:
    src = ddp_source("""
        class Trainer:
            def __init__(self, model, rank):
                self.model = DDP(model, device_ids=[rank])
                self.rank = rank

            def evaluate(self, val):
                return self.model(val).mean()

            def fit(self, loader, val):
                for step, x in enumerate(loader):
                    self.model(x).sum().backward()
                    if self.rank == 0 and step % 100 == 0:
                        with torch.no_grad():
                            self.evaluate(val)
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("with torch.no_grad():", "if True:"))] == [
        "DDP006"
    ]


def test_apex_ddp_forwards_make_no_collective() -> None:
    src = """import torch
import torch.distributed as dist
from apex.parallel import DistributedDataParallel as DDP


def train(g, loader, val, rank):
    g = DDP(g)
    for x in loader:
        g(x).sum().backward()
    if rank == 0:
        g(val)
    dist.barrier()
"""
    assert [f.code for f in lint_source(src)] == []
    torch_ddp = src.replace("from apex.parallel import", "from torch.nn.parallel import")
    assert [f.code for f in lint_source(torch_ddp)] == ["DDP006"]


NO_GRAD_PROBE = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main(model, loader, cfg, rank):
    dist.init_process_group("nccl")
    model = DistributedDataParallel(model, broadcast_buffers=cfg.broadcast_buffers)
    for x in loader:
        model(x).sum().backward()
        if rank == 0:
            with torch.no_grad():
                print(model(x).mean())
        dist.barrier()
"""


def test_a_no_grad_forward_with_buffer_broadcast_from_a_config_is_unproven() -> None:
    # physicsnemo: `broadcast_buffers=dist.broadcast_buffers`, False by default in its
    # manager; under no_grad the buffer broadcast is a forward's only collective.
    assert lint_source(NO_GRAD_PROBE) == []
    on = NO_GRAD_PROBE.replace("broadcast_buffers=cfg.broadcast_buffers", "broadcast_buffers=True")
    assert [f.code for f in lint_source(on)] == ["DDP006"]


# Validation on rank 0 alone, under no_grad, through the DDP wrapper of a model whose class
# is in this file and holds only layers without buffers (graphlearn's HGT of PyG layers).
NO_BUFFERS = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import HGTConv, Linear


class HGT(torch.nn.Module):
    def __init__(self, hidden, out):
        super().__init__()
        self.convs = torch.nn.ModuleList([HGTConv(hidden, hidden) for _ in range(2)])
        self.lin = Linear(hidden, out)
        self.head = Head(out)

    def forward(self, x):
        for conv in self.convs:
            x = conv(x)
        return self.head(self.lin(x))


class Head(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = torch.nn.Linear(n, n)
        self.norm = torch.nn.LayerNorm(n)

    def forward(self, x):
        return self.norm(self.proj(x))


@torch.no_grad()
def test(model, loader):
    return [model(x) for x in loader]


def run(rank, train_loader, val_loader, optimizer):
    dist.init_process_group("nccl", rank=rank, world_size=2)
    model = HGT(64, 10).to(rank)
    model = DistributedDataParallel(model, device_ids=[rank])
    for epoch in range(10):
        for x in train_loader:
            model(x).sum().backward()
            optimizer.step()
        dist.barrier()
        if rank == 0:
            test(model, val_loader)
        dist.barrier()
"""


def test_a_rank0_no_grad_forward_of_a_visibly_buffer_free_model_is_no_hang() -> None:
    assert finding_lines(NO_BUFFERS) == []


def test_a_layer_with_buffers_anywhere_in_the_model_brings_the_finding_back() -> None:
    # in a class the model builds, from a model zoo (its buffers are not visible)
    zoo = NO_BUFFERS.replace(
        "        self.norm = torch.nn.LayerNorm(n)",
        "        self.norm = timm.create_model('resnet18')",
    )
    assert finding_lines("import timm\n" + zoo) == [("DDP006", 46)]
    # a registered buffer in that class
    buf = NO_BUFFERS.replace(
        "        self.norm = torch.nn.LayerNorm(n)",
        "        self.register_buffer('pos', torch.zeros(n))",
    )
    assert [c for c, _ in finding_lines(buf)] == ["DDP006"]
    # a norm layer that keeps running statistics
    inorm = NO_BUFFERS.replace(
        "torch.nn.LayerNorm(n)", "torch.nn.InstanceNorm1d(n, track_running_stats=True)"
    )
    assert [c for c, _ in finding_lines(inorm)] == ["DDP006"]
    # a layer from a package whose layers are not known
    other = NO_BUFFERS.replace(
        "from torch_geometric.nn import HGTConv, Linear", "from mylayers import HGTConv, Linear"
    )
    assert [c for c, _ in finding_lines(other)] == ["DDP006"]
    # a model that is not built from this file's class
    passed = NO_BUFFERS.replace("    model = HGT(64, 10).to(rank)\n", "    model = net.to(rank)\n")
    assert [c for c, _ in finding_lines(passed)] == ["DDP006"]
    # with grad on, the forward on rank 0 alone stays a finding whatever the buffers
    grad = NO_BUFFERS.replace("@torch.no_grad()\n", "")
    assert [c for c, _ in finding_lines(grad)] == ["DDP006"]
