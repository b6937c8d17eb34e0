"""ddpguard: PyTorch DistributedDataParallel training that cannot hang silently.

Public names resolve lazily, so `import ddpguard` (and `ddpguard lint`, which never needs
torch) stays fast and each part imports only what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "World": "world",
    "DistributedSetupError": "world",
    "detect": "world",
    "setup_logging": "world",
    "init": "session",
    "shutdown": "session",
    "EvenSampler": "sampling",
    "TokenBatchSampler": "sampling",
    "JsonlDataset": "data",
    "make_loader": "data",
    "GuardConfig": "guard",
    "UnevenBatchesError": "guard",
    "BatchPlan": "batch_plan",
    "find_micro_batch": "batch_plan",
    "scaled_lr": "batch_plan",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .batch_plan import BatchPlan as BatchPlan
    from .batch_plan import find_micro_batch as find_micro_batch
    from .batch_plan import scaled_lr as scaled_lr
    from .data import JsonlDataset as JsonlDataset
    from .data import make_loader as make_loader
    from .guard import GuardConfig as GuardConfig
    from .guard import UnevenBatchesError as UnevenBatchesError
    from .sampling import EvenSampler as EvenSampler
    from .sampling import TokenBatchSampler as TokenBatchSampler
    from .session import init as init
    from .session import shutdown as shutdown
    from .world import DistributedSetupError as DistributedSetupError
    from .world import World as World
    from .world import detect as detect
    from .world import setup_logging as setup_logging
