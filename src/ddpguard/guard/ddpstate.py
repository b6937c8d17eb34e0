"""Whether the DDP module a thread is inside of is in training or evaluation mode.

A rank waiting in DDP's buffer broadcast may be running a training step that the other ranks
stopped running (one of them left early), or an evaluation through the wrapper that only this
rank runs. The module's `training` flag tells the two apart; it is read from the DDP frame's
`self` once, when a report is built.
"""

from __future__ import annotations

import sys

__all__ = ["ddp_training"]

_DDP_FILE = "torch/nn/parallel/distributed.py"


def ddp_training(ident: int | None) -> bool | None:
    """The `training` flag of the DDP module whose forward thread `ident` is in, or None when
    it is not inside one."""
    if ident is None:
        return None
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_filename.replace("\\", "/").endswith(_DDP_FILE):
            module = frame.f_locals.get("self")
            flag = getattr(module, "training", None)
            if isinstance(flag, bool):
                return flag
        frame = frame.f_back
    return None
