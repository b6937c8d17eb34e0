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
    "DistributedSampler": "sampling",
    "TokenBatchSampler": "sampling",
    "JsonlDataset": "data",
    "make_loader": "data",
    "GuardConfig": "guard",
    "UnevenBatchesError": "guard",
    "BatchPlan": "batch_plan",
    "find_micro_batch": "batch_plan",
    "scaled_lr": "batch_plan",
    "rescale_lr": "batch_plan",
    "start_plan": "batch_plan",
    "prepare_model": "model",
    "unwrap": "model",
    "to_device": "model",
    "accumulate": "model",
    "UnusedParametersError": "model",
    "Precision": "precision",
    "evaluate": "metrics",
    "EvalResult": "metrics",
    "InexactEvaluationError": "metrics",
    "InexactEvaluationWarning": "metrics",
    "all_reduce_mean": "metrics",
    "reduce_dict": "metrics",
    "NonFiniteLossError": "metrics",
    "save_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "latest_checkpoint": "checkpoint",
    "CheckpointError": "checkpoint",
    "fit": "train",
    "FitConfig": "train",
    "FitResult": "train",
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
    from .batch_plan import rescale_lr as rescale_lr
    from .batch_plan import scaled_lr as scaled_lr
    from .batch_plan import start_plan as start_plan
    from .checkpoint import CheckpointError as CheckpointError
    from .checkpoint import latest_checkpoint as latest_checkpoint
    from .checkpoint import load_checkpoint as load_checkpoint
    from .checkpoint import save_checkpoint as save_checkpoint
    from .data import JsonlDataset as JsonlDataset
    from .data import make_loader as make_loader
    from .guard import GuardConfig as GuardConfig
    from .guard import UnevenBatchesError as UnevenBatchesError
    from .metrics import EvalResult as EvalResult
    from .metrics import InexactEvaluationError as InexactEvaluationError
    from .metrics import InexactEvaluationWarning as InexactEvaluationWarning
    from .metrics import NonFiniteLossError as NonFiniteLossError
    from .metrics import all_reduce_mean as all_reduce_mean
    from .metrics import evaluate as evaluate
    from .metrics import reduce_dict as reduce_dict
    from .model import UnusedParametersError as UnusedParametersError
    from .model import accumulate as accumulate
    from .model import prepare_model as prepare_model
    from .model import to_device as to_device
    from .model import unwrap as unwrap
    from .precision import Precision as Precision
    from .sampling import DistributedSampler as DistributedSampler
    from .sampling import EvenSampler as EvenSampler
    from .sampling import TokenBatchSampler as TokenBatchSampler
    from .session import init as init
    from .session import shutdown as shutdown
    from .train import FitConfig as FitConfig
    from .train import FitResult as FitResult
    from .train import fit as fit
    from .world import DistributedSetupError as DistributedSetupError
    from .world import World as World
    from .world import detect as detect
    from .world import setup_logging as setup_logging
