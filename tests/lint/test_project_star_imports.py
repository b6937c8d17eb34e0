"""Names a file gets from `from pkg import *`: the package's `__init__.py` is the module read,
and the torch imports it brings by star imports of its own pass on (issue 35, eighth round)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

DIST_UTILS = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def cleanup():
    dist.destroy_process_group()
"""

INIT = """\
import torch

from .dist_utils import *
"""

TRAIN = """\
from src import *


def train(config, model, loader, optimizer):
    model = DDP(model)
    patience = 0
    for epoch in range(config.epochs):
        for x, y in loader:
            loss = (model(x) - y).abs().mean()
            loss.backward()
            optimizer.step()
        if config.rank in [-1, 0]:
            patience += 1
            if patience > config.patience:
                break
        dist.barrier()
    dist.barrier()
"""


def _project(tmp_path: Path, init: str) -> list[tuple[str, str, int]]:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "__init__.py").write_text(textwrap.dedent(init))
    (tmp_path / "src" / "dist_utils.py").write_text(DIST_UTILS)
    (tmp_path / "train.py").write_text(TRAIN)
    return [(Path(f.path).name, f.code, f.line) for f in lint_paths([tmp_path])]


def test_dist_through_the_packages_star_import_chain_is_torch_distributed(
        tmp_path: Path) -> None:
    # rank 0 alone leaves the epoch loop; the others wait in the next epoch's collectives
    assert _project(tmp_path, INIT) == [("train.py", "DDP019", 15)]


def test_a_package_that_does_not_pass_the_import_on_leaves_dist_unknown(
        tmp_path: Path) -> None:
    # `from src import *` then binds only what __init__.py itself defines: `dist` is not it
    assert _project(tmp_path, INIT.replace("from .dist_utils import *", "")) == []
