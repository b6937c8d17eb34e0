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
    from .session import init as init
    from .session import shutdown as shutdown
    from .world import DistributedSetupError as DistributedSetupError
    from .world import World as World
    from .world import detect as detect
    from .world import setup_logging as setup_logging
