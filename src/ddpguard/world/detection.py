"""`detect()`: the only place in ddpguard that reads launcher variables."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .environment import Environment
from .place import World
from .single import SingleProcessEnvironment
from .slurm import SlurmEnvironment
from .torchrun import TorchrunEnvironment

# Tried in order; the first that recognises the variables decides. torchrun's variables win
# over SLURM's: `srun torchrun ...` starts torchrun inside a SLURM step.
ENVIRONMENTS: tuple[Environment, ...] = (
    TorchrunEnvironment(), SlurmEnvironment(), SingleProcessEnvironment())


def detect(env: Mapping[str, str] | None = None) -> World:
    """Decide this process's place from launcher variables: torchrun first, then SLURM, else alone.

    Pure in `env` (defaults to `os.environ`). Raises ValueError naming the variable for a
    half-set or inconsistent environment instead of guessing.
    """
    env = os.environ if env is None else env
    return next(e for e in ENVIRONMENTS if e.detected(env)).world(env)
