"""Who am I in the job: rank arithmetic from the launcher's environment, and process-group set-up.

One small module per launcher environment behind one interface (environment.py): torchrun
(torchrun.py), SLURM (slurm.py), a single process (single.py); `detect()` (detection.py)
asks them in turn and is the only place in ddpguard that reads launcher variables. It takes
them as a mapping, so every launcher is testable in one process. Process-group set-up
(process_group.py) and logging (logs.py) sit apart.
"""

from __future__ import annotations

from .detection import ENVIRONMENTS, detect
from .environment import Environment
from .logs import get_logger, setup_logging
from .place import DEFAULT_PORT, World
from .process_group import (
    DEPRECATED_VARIABLES,
    NCCL_DEFAULTS,
    NONEXISTENT_VARIABLES,
    DistributedSetupError,
    destroy_process_group,
    init_process_group,
    nccl_env_defaults,
)
from .single import SingleProcessEnvironment
from .slurm import SlurmEnvironment, expand_nodelist
from .torchrun import TorchrunEnvironment

__all__ = [
    "DEFAULT_PORT",
    "DEPRECATED_VARIABLES",
    "ENVIRONMENTS",
    "NCCL_DEFAULTS",
    "NONEXISTENT_VARIABLES",
    "DistributedSetupError",
    "Environment",
    "SingleProcessEnvironment",
    "SlurmEnvironment",
    "TorchrunEnvironment",
    "World",
    "destroy_process_group",
    "detect",
    "expand_nodelist",
    "get_logger",
    "init_process_group",
    "nccl_env_defaults",
    "setup_logging",
]
